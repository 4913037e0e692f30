"""Role moves, rule by rule (`autoscale.role_moves`), against hand-computed cases; then the
look-ahead giver check through pdorch's planner (LinearPerfModel numbers: prefill 10k tok/s
raw, 8k tok/s at target; decode step 10 ms + 0.4 ms/seq, 100 seqs at 50 ms)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autoscale.decision import RoleMove
from autoscale.forecast_seam import EwmaForecaster
from autoscale.planner import PdorchPlanner, _make_pdorch
from autoscale.role_moves import PoolView, RoleMover
from autoscale.signals import Observation, Pool
from tests.autoscale.obs import latency, observation, pinned_planner, policy, replicas
from tests.autoscale.perf_double import LinearPerfModel

P, D = Pool.PREFILL, Pool.DECODE


def view(ready: int, **kw: Any) -> PoolView:
    """A pool that needs 1 replica and has `ready` (override any field)."""
    base = PoolView(
        ready=ready,
        pending=0,
        desired=ready,
        ahead=1,
        now=1,
        urgent=1,
        keep=1,
        minimum=1,
        maximum=16,
        breach=False,
    )
    return replace(base, **kw)


def mover() -> RoleMover:
    return RoleMover(hold_s=180.0)


# ------------------------------------------------------------------------- pure rules


def test_slack_is_ready_minus_the_largest_of_horizon_need_now_need_consolidation_and_min() -> None:
    assert RoleMover.slack(view(6, ahead=2, now=3, keep=1)) == 3  # 6 - 3 (now binds)
    assert RoleMover.slack(view(6, ahead=5, now=3, keep=1)) == 1  # 6 - 5 (the horizon binds)
    assert RoleMover.slack(view(6, ahead=2, now=2, keep=6)) == 0  # breaching: keep = ready
    assert RoleMover.slack(view(3, ahead=4)) == 0  # short at its horizon: never negative


def test_a_breach_now_borrows_the_givers_horizon_slack() -> None:
    # prefill 1 ready, urgent 4 -> short 3 now; decode 6 ready needs 4 at its horizon -> 2.
    plan = mover().decide(0.0, {P: view(1, urgent=4, desired=2), D: view(6, ahead=4)})
    assert plan.moves == (RoleMove(D, P, 2),)
    # the moved replicas are never cancelled on landing: P at least 1 + 2; D drops by 2
    assert plan.desired == {P: 3, D: 4}
    assert plan.reasons == {P: "role-move", D: "role-move"}


def test_no_move_when_the_givers_forecast_needs_its_replicas() -> None:
    # same shortage, but decode's floor at now + startup_s is its 6 ready: slack 0
    plan = mover().decide(0.0, {P: view(1, urgent=4, desired=2, breach=True), D: view(6, ahead=6)})
    assert plan.moves == () and plan.desired == {P: 2, D: 6}


def test_a_forecast_only_shortage_takes_idle_slack_instead_of_a_cold_start() -> None:
    # prefill wants 3 (its floor, one start-up ahead) but needs only its 1 now; decode's 6
    # need 1 over its horizon. Stand-in: 2 move instead of 2 cold starts (prefill's desired
    # stays 3, decode drops by 2); bridge only: a cold start lands in time, nothing moves.
    views = {P: view(1, desired=3, ahead=3), D: view(6)}
    plan = mover().decide(0.0, views)
    assert plan.moves == (RoleMove(D, P, 2),) and plan.desired == {P: 3, D: 4}
    bridge_only = RoleMover(hold_s=180.0, stand_in=False).decide(0.0, views)
    assert bridge_only.moves == () and bridge_only.desired == {P: 3, D: 6}


def test_a_breach_with_cold_starts_pending_still_borrows_one() -> None:
    # the queue term holds at the provisioned 4 (3 pending), but p99 breaches now and the
    # pending cold starts serve only at their start-up: 1 short now
    plan = mover().decide(
        0.0, {P: view(1, pending=3, desired=4, urgent=1, breach=True), D: view(3)}
    )
    assert plan.moves == (RoleMove(D, P, 1),)
    assert plan.desired == {P: 5, D: 2}


def test_a_move_in_flight_is_not_ordered_again() -> None:
    m = mover()
    p = view(1, urgent=3)
    assert m.decide(0.0, {P: p, D: view(6)}).moves == (RoleMove(D, P, 2),)
    # 5 s later the 2 are still draining/switching (pending in prefill): nothing new
    p2 = replace(p, pending=2, desired=3)
    assert m.decide(5.0, {P: p2, D: view(4)}).moves == ()
    # past settle_s (30 s) a pending replica is no longer taken for a move: short again
    assert m.decide(35.0, {P: p2, D: view(4)}).moves == (RoleMove(D, P, 2),)


def test_the_loan_returns_once_the_borrowers_cold_starts_land_and_the_lender_wants_it() -> None:
    m = mover()
    m.decide(0.0, {P: view(1, urgent=3, desired=3), D: view(4, ahead=2)})  # lend 2 to P
    assert m.loans == {(D, P): 2}
    # 130 s: P's cold starts are ready, it has 5 for a need of 3 (slack 2); decode's
    # forecast rose, it wants 3 (2 ready, 1 cold start pending): 1 returns instead
    plan = m.decide(
        130.0,
        {
            P: view(5, desired=5, ahead=3, now=3, keep=3),
            D: view(2, pending=1, desired=3, ahead=3),
        },
    )
    assert plan.moves == (RoleMove(P, D, 1),)
    # decode's desired stays 3: with the returned replica pending it has 4, so the actuator
    # cancels its cold start; prefill drops by 1
    assert plan.desired == {P: 4, D: 3}
    assert plan.reasons == {P: "role-return", D: "role-return"}
    assert m.loans == {(D, P): 1}


def test_a_loan_the_lender_never_asks_back_stays() -> None:
    m = mover()
    m.decide(0.0, {P: view(1, urgent=3, desired=3), D: view(4, ahead=2)})
    plan = m.decide(130.0, {P: view(5, desired=5, ahead=3, now=3, keep=3), D: view(2, ahead=2)})
    assert plan.moves == () and m.loans == {(D, P): 2}


def test_no_flapping_a_pool_that_gave_back_does_not_take_again_within_the_hold() -> None:
    m = mover()
    m.decide(0.0, {P: view(1, urgent=3, desired=3), D: view(4, ahead=2)})
    m.decide(130.0, {P: view(5, keep=3, now=3, ahead=3), D: view(2, pending=1, desired=3)})
    # prefill short again 20 s after giving one back: no borrow within the 180 s hold
    short_again = {P: view(4, urgent=5, breach=True), D: view(4, ahead=2)}
    for t in (150.0, 200.0, 305.0):
        assert m.decide(t, short_again).moves == ()
    assert m.decide(311.0, short_again).moves == (RoleMove(D, P, 1),)


def test_a_pool_that_lent_does_not_borrow_back_while_owed() -> None:
    # decode lent 2 to prefill; now decode breaches and prefill has no slack: decode
    # cold-starts, it does not take prefill's replicas by a borrow
    m = mover()
    m.decide(0.0, {P: view(1, urgent=3, desired=3), D: view(4, ahead=2)})
    plan = m.decide(60.0, {P: view(3, now=3, keep=3), D: view(2, breach=True, urgent=3)})
    assert plan.moves == ()


# ------------------------------------------------------------- through the planner


class Forecast:
    """A forecaster with a fixed answer at the horizon (the seam, nothing else)."""

    def __init__(self, now_rps: float, ahead_rps: float, osl: float) -> None:
        self.now_rps, self.ahead_rps, self.osl = now_rps, ahead_rps, osl

    def observe(self, observation: Observation) -> None:
        pass

    def forecast(self, horizon_s: float) -> tuple[float, float, float, float]:
        return (self.now_rps if horizon_s < 60.0 else self.ahead_rps, 1000.0, self.osl, 0.0)


def pdorch(forecaster: Any | None = None) -> PdorchPlanner:
    return pinned_planner(
        policy(role_switching=True, down_s=600.0),
        LinearPerfModel(),
        forecaster=forecaster or EwmaForecaster(alpha=1.0),
        headroom=1.0,
        forecast_window_s=0.0,
        trend_cap=4.0,
        ramp_epsilon=0.0,  # the floor's plain ceil (Round 13's default 0.1 moves the edges)
        prefill_floor_hold_s=None,
    )


def breaching_prefill(rate: float) -> Observation:
    # 1 prefill replica, p99 TTFT 3 s (> 2 s), 16k tokens queued; 4 idle decode replicas
    reps = replicas(P, 1, queued_prefill_tokens=16_000) + replicas(D, 4)
    return observation(rate=rate, osl=200.0, p=(1, 0), d=(4, 0), ttft=latency(3.0), reps=reps)


def test_planner_moves_when_the_giver_has_slack_at_its_horizon() -> None:
    # 8 rps: decode needs 8 * (0.1 + 200 * 0.05) = 80.8 seqs -> 1 now and at 120 s.
    # prefill, for a replica serving in 5 s: 16k - (10k - 8k) * 5 = 6k left over 5 s ->
    # (8k + 1.2k) / 10k -> 1, and p99 breaches: +1 -> 2, i.e. 1 short now.
    # decode's slack 4 - 1 = 3: 1 moves (what prefill lacks now), no cold start.
    d = pdorch(Forecast(8.0, 8.0, 200.0)).plan(breaching_prefill(8.0))
    assert d.moves == (RoleMove(D, P, 1),)
    assert d.details["role_moves"]["decode"]["slack"] == 3
    assert d.desired[P] == 2 and d.desired[D] == 3


def test_planner_keeps_the_replica_when_the_givers_forecast_needs_it() -> None:
    # same now, but the forecast is 40 rps at now + 120 s (capped at 4 x 8 = 32 rps):
    # decode then needs 32 * 10.1 = 323 seqs -> 4, its 4 ready: slack 0; prefill cold-starts
    # its floor's 32k / 8k = 4
    d = pdorch(Forecast(8.0, 40.0, 200.0)).plan(breaching_prefill(8.0))
    assert d.moves == ()
    assert d.details["role_moves"]["decode"]["slack"] == 0
    assert d.desired[P] == 4 and d.desired[D] == 4
    assert d.details["decode"]["floor"] == 4


# ------------------------------------------------- move stabilization (Round 11)


def stable() -> RoleMover:
    return RoleMover(hold_s=180.0, reversal_window_s=600.0)


def test_stabilized_slack_also_clears_the_givers_widened_need() -> None:
    # decode 6 ready, floor 5 (slack 1), but the need widened by the band is 6: no slack
    d = view(6, ahead=5, hold=6)
    assert RoleMover.slack(d) == 1 and RoleMover.slack(d, banded=True) == 0
    short = {P: view(1, urgent=2, breach=True), D: d}
    assert mover().decide(0.0, short).moves == (RoleMove(D, P, 1),)
    assert stable().decide(0.0, short).moves == ()


def test_a_borrower_returns_only_what_its_own_way_down_would_release() -> None:
    # decode lent 1 at 0 s; at 20 s prefill has one tick of slack (need 3 of 5) and decode's
    # floor asks for one more. Prefill breached 15 s ago: its way down holds 5 (hold 5), so
    # the stabilized mover keeps the replica; the unstabilized one returns it at once
    after = {P: view(5, ahead=3, now=3, keep=3, hold=5), D: view(4, desired=5, ahead=5)}
    for m, returned in ((mover(), (RoleMove(P, D, 1),)), (stable(), ())):
        assert m.decide(0.0, {P: view(4, urgent=5, breach=True), D: view(5, ahead=4)}).moves
        assert m.decide(20.0, after).moves == returned
    # once prefill's way down releases the replica (hold 4) it goes back, window or not: a
    # refused return would be a budget trade (a drain of prefill, a cold start of decode)
    m = stable()
    m.decide(0.0, {P: view(4, urgent=5, breach=True), D: view(5, ahead=4)})
    released = {P: replace(after[P], hold=4), D: after[D]}
    assert m.decide(200.0, released).moves == (RoleMove(P, D, 1),)


def test_a_borrow_into_a_pool_that_just_gave_needs_its_breach() -> None:
    # prefill returned 1 to a breaching decode at 130 s; at 400 s (past the 180 s hold)
    # prefill's floor alone asks for one more (stand-in, no breach): refused within the 600 s
    # window; a breach of prefill borrows at once
    m = stable()
    m.decide(0.0, {P: view(1, urgent=3, desired=3), D: view(4, ahead=2)})
    back = {P: view(5, keep=3, now=3, ahead=3), D: view(2, pending=1, desired=3, breach=True)}
    assert m.decide(130.0, back).moves == (RoleMove(P, D, 1),)
    forecast_only = {P: view(4, desired=5, ahead=5, now=4, keep=4), D: view(4, ahead=2)}
    assert m.decide(400.0, forecast_only).moves == ()
    breach = {P: replace(forecast_only[P], breach=True), D: forecast_only[D]}
    assert m.decide(405.0, breach).moves == (RoleMove(D, P, 1),)
    assert mover_borrows(forecast_only)


def mover_borrows(views: dict[Pool, PoolView]) -> bool:
    """The same views without stabilization do move (so the refusal above is the rule's)."""
    m = mover()
    m.decide(0.0, {P: view(1, urgent=3, desired=3), D: view(4, ahead=2)})
    m.decide(130.0, {P: view(5, keep=3, now=3, ahead=3), D: view(2, pending=1, desired=3)})
    return m.decide(400.0, views).moves == (RoleMove(D, P, 1),)


def test_the_planner_records_a_move_as_both_pools_direction_change() -> None:
    pl = pinned_planner(
        policy(role_switching=True, down_s=600.0),
        LinearPerfModel(),
        forecaster=EwmaForecaster(alpha=1.0),
        headroom=1.0,
        forecast_window_s=0.0,
        trend_cap=4.0,
        move_stabilization=True,
    )
    d = pl.plan(breaching_prefill(1.0))
    assert d.moves and d.moves[0].from_pool is D
    # the giver's last move is now a down (its next up is a reversal), the taker's an up
    assert pl._stabilizers[D].reverses_down()
    assert pl._stabilizers[P].banded(d.now) and not pl._stabilizers[P].reverses_down()
    # without the option the stabilizers never hear of the move
    plain = pdorch()
    assert plain.plan(breaching_prefill(1.0)).moves
    assert not plain._stabilizers[D].reverses_down()


# ------------------------------------------------- the release check alone (Round 13)


def released_only() -> RoleMover:
    return RoleMover(hold_s=180.0, release_check=True)


def test_the_release_check_alone_gives_only_what_the_way_down_releases() -> None:
    # rule (a) without (b): the giver's held need (hold 6 of 6 ready) refuses the lend, and a
    # borrower whose way down holds the replica (hold 5) does not return it
    short = {P: view(1, urgent=2, breach=True), D: view(6, ahead=5, hold=6)}
    assert released_only().decide(0.0, short).moves == ()
    after = {P: view(5, ahead=3, now=3, keep=3, hold=5), D: view(4, desired=5, ahead=5)}
    m = released_only()
    assert m.decide(0.0, {P: view(4, urgent=5, breach=True), D: view(5, ahead=4)}).moves
    assert m.decide(20.0, after).moves == ()
    assert m.decide(200.0, {P: replace(after[P], hold=4), D: after[D]}).moves == (
        RoleMove(P, D, 1),
    )


def test_the_release_check_alone_does_not_refuse_a_re_borrow() -> None:
    # the forecast-only re-borrow that move stabilization refuses (rule (b)) goes ahead
    m = released_only()
    m.decide(0.0, {P: view(1, urgent=3, desired=3), D: view(4, ahead=2)})
    back = {P: view(5, keep=3, now=3, ahead=3), D: view(2, pending=1, desired=3, breach=True)}
    assert m.decide(130.0, back).moves == (RoleMove(P, D, 1),)
    forecast_only = {P: view(4, desired=5, ahead=5, now=4, keep=4), D: view(4, ahead=2)}
    assert m.decide(400.0, forecast_only).moves == (RoleMove(D, P, 1),)
    assert m.refused == 0


def test_the_planners_release_check_reads_the_way_down_but_records_no_move() -> None:
    pl = pinned_planner(
        policy(role_switching=True, down_s=600.0),
        LinearPerfModel(),
        forecaster=EwmaForecaster(alpha=1.0),
        headroom=1.0,
        forecast_window_s=0.0,
        trend_cap=4.0,
        move_release_check=True,
    )
    assert pl.cross.mover.release_check and pl.cross.mover.reversal_window_s == 0
    d = pl.plan(breaching_prefill(1.0))
    # the first tick: decode's way down has only this tick's raw count, below its ready
    assert d.moves and d.moves[0].from_pool is D
    assert not pl._stabilizers[D].reverses_down()


def test_the_policys_move_release_check_reaches_the_mover() -> None:
    pol = policy(role_switching=True)
    on = pol.model_copy(
        update={"planner": pol.planner.model_copy(update={"move_release_check": True})}
    )
    assert _make_pdorch(on, LinearPerfModel()).cross.mover.release_check
    assert not _make_pdorch(pol, LinearPerfModel()).cross.mover.release_check
