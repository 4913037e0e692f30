"""pdorch's planner, rule by rule, against hand-computed counts (LinearPerfModel numbers:
prefill 10k tok/s raw, 8k tok/s at target; decode step 10 ms + 0.4 ms/seq, 100 seqs at 50 ms).
"""

from __future__ import annotations

from typing import Any

import pytest

from autoscale.budget import attainment_estimate, split_budget
from autoscale.cross_pool import CrossPoolSteps
from autoscale.decision import RoleMove
from autoscale.forecast_seam import EwmaForecaster, LoadForecast
from autoscale.planner import PdorchPlanner
from autoscale.planner_base import planner_factory
from autoscale.policy import Intervals, SloPolicy
from autoscale.signals import Observation, Pool
from tests.autoscale.obs import latency, observation, pinned_planner, policy, replicas
from tests.autoscale.perf_double import LinearPerfModel

P, D = Pool.PREFILL, Pool.DECODE


def planner(pol: SloPolicy | None = None, **options: Any) -> PdorchPlanner:
    options.setdefault("forecaster", EwmaForecaster(alpha=1.0))
    options.setdefault("headroom", 1.0)
    options.setdefault("forecast_window_s", 0.0)  # feed the forecaster every tick (rule tests)
    options.setdefault("level_window_s", 0.0)  # each window's load as it is (rule tests)
    options.setdefault("ramp_epsilon", 0.0)  # the floor's plain ceil (rule tests; Round 13)
    options.setdefault("prefill_floor_hold_s", None)  # the floor_hold_s windows (Round 13)
    options.setdefault("prefill_scale_down_s", None)  # prefill on the planner's windows (R. 16)
    return pinned_planner(pol or policy(), LinearPerfModel(), **options)


def test_predictive_floor_sizes_prefill_by_tokens_and_decode_by_littles_law() -> None:
    # prefill: 16 rps * 1000 tok = 16k tok/s over 8k tok/s per replica = 2.
    # decode: 20 rps * (0.1 s own prefill + 200 * 0.05 s) = 202 seqs over 100 = 3.
    # 16 rps and 20 rps cannot both hold, so look at each pool on its own load.
    d1 = planner().plan(observation(rate=16.0, p=(2, 0), d=(2, 0)))
    assert d1.desired[P] == 2 and d1.reasons[P] == "ttft-throughput"
    d2 = planner().plan(observation(rate=20.0, p=(3, 0), d=(3, 0)))
    assert d2.desired[D] == 3 and d2.reasons[D] == "itl-concurrency"
    assert d2.details["decode"]["floor_inputs"]["ttft_term_s"] == 0.1


def test_prefix_hits_and_headroom_change_the_floor() -> None:
    # half the prompt cached: 16 rps * 500 = 8k tok/s -> 1 replica; headroom 0.5 -> 2.
    assert planner().plan(observation(rate=16.0, hit=0.5)).desired[P] == 1
    assert planner(headroom=0.5).plan(observation(rate=16.0, hit=0.5, p=(2, 0))).desired[P] == 2


def test_floor_counts_pending_replicas_as_provisioned() -> None:
    # 32k tok/s needs 4; 2 ready + 2 pending already provide them: desired stays 4.
    decision = planner().plan(observation(rate=32.0, p=(2, 2), d=(8, 0)))
    assert decision.desired[P] == 4


def test_breach_adds_one_replica_only_when_none_is_pending() -> None:
    slow = latency(3.0)  # p99 TTFT 3 s > 2 s target
    plain = planner().plan(observation(rate=1.0, p=(3, 0), ttft=slow))
    assert plain.desired[P] == 4 and plain.reasons[P] == "ttft-breach"
    pl = planner()
    for t in (0.0, 5.0, 10.0):  # the breach persists while the new replica starts: no cascade
        d = pl.plan(observation(t, rate=1.0, p=(3, 1), ttft=slow))
        assert d.desired[P] == 4 and d.reasons[P] == "ttft-breach-pending"


def test_queue_term_drains_the_queue_within_the_ttft_budget_when_starts_are_instant() -> None:
    # startup 0: 2 replicas hold 19k queued tokens each: (38k / (2 - 0.1) + 10k tok/s) / 10k = 3.
    reps = replicas(P, 2, queued_prefill_tokens=19_000)
    obs = observation(rate=10.0, p=(2, 0), reps=reps)
    decision = planner(policy(startup_s=0.0)).plan(obs)
    assert decision.desired[P] == 3 and decision.reasons[P] == "ttft-queue"
    # startup 120 s: the 2 replicas (10k tok/s spare) drain it long before a new one is ready
    assert planner().plan(obs).desired[P] == 2


def test_queue_term_orders_for_the_backlog_left_when_new_replicas_are_ready() -> None:
    # 30k tok/s on 2 replicas (20k): the 38k queue grows by 10k/s for 120 s -> 1.238M left,
    # drained over 120 s -> 10.3k tok/s more: ceil((30k + 10.3k) / 10k) = 5.
    reps = replicas(P, 2, queued_prefill_tokens=19_000)
    decision = planner().plan(observation(rate=30.0, p=(2, 0), d=(9, 0), reps=reps))
    assert decision.desired[P] == 5 and decision.reasons[P] == "ttft-queue"
    inputs = decision.details["prefill"]["reactive_inputs"]
    assert inputs["backlog_at_start_tokens"] == pytest.approx(1_238_000)
    # 3 of them pending already: the backlog cannot order more than the provisioned 5
    held = planner().plan(observation(rate=30.0, p=(2, 3), d=(9, 0), reps=reps))
    assert held.desired[P] == 5


def test_decode_kv_usage_term() -> None:
    reps = replicas(D, 2, kv_usage=0.99, num_running=10)  # sum 1.98 / 0.9 -> 3
    decision = planner().plan(observation(d=(2, 0), reps=reps))
    assert decision.desired[D] == 3 and decision.reasons[D] == "kv-usage"


def test_scale_down_waits_for_the_stabilization_window() -> None:
    pl = planner(policy(down_s=60.0, intervals=Intervals(predictive_s=5.0)))
    busy = pl.plan(observation(0.0, rate=32.0, p=(4, 0)))
    assert busy.desired[P] == 4
    for t in (10.0, 30.0, 60.0):  # idle, but the t=0 recommendation is still in the window
        d = pl.plan(observation(t, rate=0.0, p=(4, 0)))
        assert d.desired[P] == 4 and d.reasons[P] == "stabilization"
    assert pl.plan(observation(65.0, rate=0.0, p=(4, 0))).desired[P] == 1


def test_scale_down_stops_where_the_consolidation_check_fails() -> None:
    # 5 decode replicas with 50 seqs each: 250 seqs fit 3 replicas at the target (raw 3), but
    # the predicted step must stay <= 0.8 * 50 ms: on 3, 84 seqs -> 43.6 ms; on 4, 63 -> 35.2 ms.
    # (the observed-sequences check, `decode_fit_as_floor=False`; the floor's model on 0.1 rps
    # fits 1, and the raw 3 binds)
    reps = replicas(D, 5, num_running=50)
    decision = planner(decode_fit_as_floor=False).plan(observation(rate=0.1, d=(5, 0), reps=reps))
    assert decision.details["decode"]["raw"] == 3
    assert decision.desired[D] == 4 and decision.reasons[D] == "consolidation"


def test_no_scale_down_while_the_target_is_breached() -> None:
    pl = planner()
    d = pl.plan(observation(rate=0.1, d=(4, 1), itl=latency(0.08)))
    assert d.desired[D] == 5  # the breach holds provisioned (pending counted), nothing drains


def test_min_and_max_bind_with_their_names() -> None:
    huge = planner(policy(pmax=5)).plan(observation(rate=1000.0, p=(5, 0)))
    assert huge.desired[P] == 5 and huge.reasons[P] == "max"
    idle = planner().plan(observation(rate=0.0))
    assert idle.desired == {P: 1, D: 1} and idle.reasons[P] == "min"


def test_budget_split_by_marginal_gain_by_hand() -> None:
    # want P=2, D=3, budget 4, min 1 each: (1,1) -> tie (gain 1/6 each), D further from its
    # want -> (1,2); then P gains 1/3 vs D 1/6 -> (2,2).
    assert split_budget({P: 2, D: 3}, {P: 1, D: 1}, {P: 1, D: 1}, 4) == {P: 2, D: 2}
    assert attainment_estimate({P: 2, D: 2}, {P: 2, D: 3}) == 2 / 3
    # a prefill replica costs 2 GPUs: only decode fits the last GPU.
    assert split_budget({P: 2, D: 2}, {P: 1, D: 1}, {P: 2, D: 1}, 4) == {P: 1, D: 2}
    assert split_budget({P: 2, D: 2}, {P: 1, D: 1}, {P: 1, D: 1}, 9) == {P: 2, D: 2}


def test_budget_split_keeps_the_last_split_within_the_margin_by_hand() -> None:
    mins, gpus = {P: 1, D: 1}, {P: 1, D: 1}
    # want P=12, D=6 in 16: fresh (10, 6) has A = 10/12 = 0.833; kept (11, 5) has
    # 11/12 * 5/6 = 0.764: a gain of 0.069
    assert split_budget({P: 12, D: 6}, mins, gpus, 16) == {P: 10, D: 6}
    kept = {P: 11, D: 5}
    assert split_budget({P: 12, D: 6}, mins, gpus, 16, kept, margin=0.05) == {P: 10, D: 6}
    assert split_budget({P: 12, D: 6}, mins, gpus, 16, kept, margin=0.1) == kept
    # a kept split above a pool's new want, or over the budget, is not valid: fresh
    # (P wants 10 < 11 kept; fresh: (9, 7) has A = 0.9 against (10, 6) 6/7 = 0.857)
    assert split_budget({P: 10, D: 7}, mins, gpus, 16, kept, margin=1.0) == {P: 9, D: 7}
    assert split_budget({P: 12, D: 6}, mins, gpus, 15, kept, margin=1.0) == {P: 9, D: 6}
    # a budget that does not bind gives the wants whatever was kept
    assert split_budget({P: 3, D: 3}, mins, gpus, 16, kept, margin=1.0) == {P: 3, D: 3}


def test_planner_applies_the_budget() -> None:
    # P wants 2 (16 rps), D wants 3 (202 seqs... at 20 rps: P then wants 3): use 16 rps and
    # OSL 300 -> S = 16 * (0.1 + 15) = 241.6 -> D wants 3.
    pl = planner(policy(budget=4))
    d = pl.plan(observation(rate=16.0, osl=300.0, p=(2, 0), d=(3, 0)))
    assert d.desired == {P: 2, D: 2} and d.reasons[D] == "budget"


def test_role_switch_moves_idle_decode_replicas_to_a_short_prefill_pool() -> None:
    # prefill has 1 replica for 24k tok/s: the backlog it piles up (14k/s for 120 s) drained
    # over 120 s more -> ceil((24k + 14k) / 10k) = 4. Decode has 4 ready and no work, keeps its
    # min 1: move 3, no cold start.
    obs = observation(rate=24.0, osl=1.0, p=(1, 0), d=(4, 0), reps=replicas(D, 4))
    switched = planner(policy(role_switching=True, down_s=600.0)).plan(obs)
    assert switched.moves == (RoleMove(D, P, 3),)
    assert switched.desired[P] == 4 and switched.desired[D] == 1
    assert switched.reasons[D] == "role-move"
    plain = planner(policy(down_s=600.0)).plan(obs)
    assert plain.moves == () and plain.desired == {P: 4, D: 4}


def test_role_switch_keeps_what_the_giver_needs() -> None:
    # decode holds 200 seqs on 4 replicas: on 2 the step would be 10 + 100 * 0.4 = 50 ms > 40 ms
    # (0.8 * target), on 3 it is 10 + 67 * 0.4 = 36.8 ms: it keeps 3, so only 1 moves.
    # (the observed-sequences check, `decode_fit_as_floor=False`: 24 rps of 1-token outputs
    # are 3.6 seqs by the floor's Little's law)
    obs = observation(rate=24.0, osl=1.0, p=(1, 0), d=(4, 0), reps=replicas(D, 4, num_running=50))
    pl = planner(policy(role_switching=True, down_s=600.0), decode_fit_as_floor=False)
    d = pl.plan(obs)
    assert d.moves == (RoleMove(D, P, 1),) and d.desired[D] == 3


def test_correction_factor_tightens_capacity_when_the_model_is_optimistic() -> None:
    # 1 ready replica at 5 rps: rho = 5 * 0.1 = 0.5, model mean TTFT = 0.1 * 1.5 = 0.15 s;
    # observed 0.3 s -> raw k = 2, EWMA with alpha 1 -> 2: capacity 8k/2 = 4k tok/s.
    pl = planner(correction_alpha=1.0)
    d = pl.plan(observation(rate=5.0, p=(1, 0), ttft=latency(0.3)))
    assert pl.correction[P] == pytest.approx(2.0)
    assert d.desired[P] == 2  # 5k tok/s over 4k


def test_registered_factory_takes_policy_model_and_options() -> None:
    pl = planner_factory("pdorch")(policy(), LinearPerfModel(), headroom=1.0)
    assert isinstance(pl, PdorchPlanner) and pl.interval_s == 5.0


class RampForecaster:
    """A forecaster whose load doubles by the horizon (implements the seam, nothing else)."""

    def __init__(self) -> None:
        self.seen = 0

    def observe(self, observation: Observation) -> None:
        self.seen += 1

    def forecast(self, horizon_s: float) -> tuple[float, float, float, float]:
        return (16.0 if horizon_s < 60.0 else 32.0, 1000.0, 200.0, 0.0)


def test_floor_is_sized_for_the_load_forecast_one_startup_ahead() -> None:
    ramp = RampForecaster()
    d = planner(forecaster=ramp, trend_cap=2.0).plan(observation(rate=16.0, p=(2, 0), d=(8, 0)))
    assert ramp.seen == 1
    assert d.desired[P] == 4  # 32 rps at now + 120 s, not the 16 of now
    assert d.details["prefill"]["floor_inputs"]["horizon_s"] == 120.0


def test_no_role_move_between_replicas_of_different_gpu_counts() -> None:
    obs = observation(rate=24.0, osl=1.0, p=(1, 0), d=(4, 0), reps=replicas(D, 4))
    d = planner(policy(role_switching=True, down_s=600.0, pgpus=2)).plan(obs)
    assert d.moves == () and d.desired[D] == 4


def test_role_moves_make_the_queue_term_drain_within_the_switch_time() -> None:
    # 200k tokens queued on 1 prefill replica, 12k tok/s arriving; decode needs 2 of its 6.
    # cold starts (120 s): the rest 200k + 2k*120 = 440k over 120 s -> ceil(1.57) = 2: the
    # pool's own count, the same with role moves on (its cold starts are sized on startup_s).
    # Moved replicas (5 s): 200k + 2k*5 = 210k over 5 s -> ceil((12k + 42k) / 10k) = 6, i.e.
    # 5 short now; decode gives its slack 4 (it keeps its 2): 1 + 4 = 5, no cold start.
    reps = replicas(P, 1, queued_prefill_tokens=200_000) + replicas(D, 6)
    obs = observation(rate=12.0, p=(1, 0), d=(6, 0), reps=reps)
    assert planner(policy(down_s=600.0)).plan(obs).desired[P] == 2
    fast = planner(policy(role_switching=True, down_s=600.0)).plan(obs)
    assert fast.moves == (RoleMove(D, P, 4),)
    assert fast.desired == {P: 5, D: 2}
    moves = fast.details["role_moves"]
    assert moves["prefill"]["short_now"] == 5 and moves["decode"]["slack"] == 4


def test_forecaster_is_fed_one_aggregate_per_window_and_the_trend_is_capped() -> None:
    seen: list[Observation] = []

    class Recording(EwmaForecaster):
        def observe(self, observation: Observation) -> None:
            seen.append(observation)
            super().observe(observation)

    pl = planner(forecaster=Recording(alpha=1.0), forecast_window_s=60.0)
    for i in range(12):  # 12 windows of 5 s: 8 rps then 16 rps
        pl.plan(observation(5.0 * (i + 1), rate=8.0 if i < 6 else 16.0, p=(2, 0), d=(8, 0)))
    assert len(seen) == 1  # nothing before one whole minute, then one aggregate
    assert seen[0].window_s == 60.0 and seen[0].arrival_rps == pytest.approx(12.0)
    # a forecaster projecting 2x growth in 120 s is capped at trend_cap (1.5) x its level
    d = planner(forecaster=RampForecaster(), trend_cap=1.5).plan(
        observation(rate=16.0, p=(2, 0), d=(8, 0))
    )
    assert d.desired[P] == 3  # 1.5 * 16 rps * 1000 tok / 8k tok/s, not the 32 rps ramp's 4


def test_floor_before_the_first_whole_window_is_sized_on_what_was_seen() -> None:
    # 16 rps * 1000 tok over 8k tok/s = 2 prefill replicas, from the first 5 s window alone
    # (the forecaster has nothing yet: a floor of 0 would let a role move strip a pool bare)
    d = planner(forecast_window_s=60.0).plan(observation(5.0, rate=16.0, p=(1, 0), d=(8, 0)))
    assert d.details["prefill"]["floor"] == 2
    assert d.details["prefill"]["floor_inputs"]["rate_rps"] == 16.0


def test_no_correction_is_learnt_from_a_pool_with_replicas_pending() -> None:
    # 1 rps on 1 ready prefill replica: rho = 0.1, the model's M/D/1 mean TTFT is
    # 0.1 * (1 + 0.1 / 1.8) = 0.1056 s; 0.2 s observed (no breach) -> raw 1.895, EWMA 0.2:
    # k = 1 + 0.2 * 0.895 = 1.179. With a replica pending the pool is known to be short and
    # the window teaches nothing.
    seen = observation(rate=1.0, p=(1, 0), ttft=latency(0.2))
    k = planner().plan(seen).details["correction"]["prefill"]
    assert k == pytest.approx(1.0 + 0.2 * (0.2 / (0.1 * (1 + 0.1 / 1.8)) - 1.0))
    pending = observation(rate=1.0, p=(1, 1), ttft=latency(0.2))
    assert planner().plan(pending).details["correction"]["prefill"] == 1.0


def test_decode_floor_counts_the_models_prefill_time_not_the_observed_ttft() -> None:
    # 19.5 rps, OSL 200: 19.5 * (0.1 + 10) = 196.95 seqs -> 2 decode replicas; with the
    # observed 1.5 s mean TTFT in the residence it would be 19.5 * 11.5 = 224 -> 3
    d = planner().plan(observation(rate=19.5, p=(3, 0), d=(3, 0), ttft=latency(1.5)))
    assert d.details["decode"]["floor"] == 2
    assert d.details["decode"]["floor_inputs"]["ttft_term_s"] == 0.1


class SwitchForecaster(EwmaForecaster):
    """15 rps now; `ahead` rps at 120 s (set by the test between ticks)."""

    ahead = 15.0

    def forecast(self, horizon_s: float) -> LoadForecast:
        return LoadForecast(15.0 if horizon_s < 60.0 else self.ahead, 1000.0, 200.0, 0.0)


def test_floor_orders_for_growth_only_once_it_is_sustained_for_30_s() -> None:
    # level 15 rps -> 15k / 8k = 1.9 -> 2 prefill; 22 rps projected at +120 s -> 2.75 -> 3.
    # The growth counted is the mean over the ticks of the last 30 s: one tick of it among
    # seven is 7 / 7 = 1 rps -> 2; projected at every tick of the window -> 3.
    fc = SwitchForecaster(alpha=1.0)
    pl = planner(forecaster=fc)
    floors = {}
    for t in range(0, 70, 5):
        fc.ahead = 22.0 if t == 30 or t >= 45 else 15.0
        d = pl.plan(observation(float(t), rate=15.0, p=(2, 0), d=(8, 0)))
        floors[t] = d.details["prefill"]["floor"]
    assert floors[30] == floors[40] == 2  # [10, 40]: the t = 30 tick alone -> 16 / 8 = 2
    assert floors[65] == 3  # [35, 65]: 2 of 7 ticks without growth -> 5 rps -> 20 / 8 -> 3
    # trend_hold_s 0: the projection of this tick alone is ordered for
    fc.ahead = 22.0
    d = planner(forecaster=fc, trend_hold_s=0.0).plan(observation(rate=15.0, p=(2, 0), d=(8, 0)))
    assert d.details["prefill"]["floor"] == 3


def test_scale_down_sooner_once_n_minus_k_fits_for_a_minute() -> None:
    # 4 prefill replicas, 8k tok/s arriving: raw 1, but the check fits 2 (8k <= 0.8*2*8k,
    # not 0.8*1*8k). The 600 s window is not waited for: after 60 s of ticks that all fit 2,
    # the pool goes to 2.
    pl = planner(policy(down_s=600.0))
    for t in range(0, 60, 5):
        d = pl.plan(observation(float(t), rate=8.0, p=(4, 0), d=(8, 0)))
        assert d.desired[P] == 4 and d.reasons[P] == "stabilization"
    d = pl.plan(observation(60.0, rate=8.0, p=(4, 0), d=(8, 0)))
    assert d.desired[P] == 2 and d.reasons[P] == "sustained-fit"
    # a queue at t = 30 (100k tokens: 2.5 s of waiting even on 4) fits no smaller count: the
    # minute restarts there, and the pool goes to 2 only at t = 95
    queued = replicas(P, 4, queued_prefill_tokens=25_000)
    pl = planner(policy(down_s=600.0))
    for t in range(0, 95, 5):
        reps = queued if t == 30 else ()
        d = pl.plan(observation(float(t), rate=8.0, p=(4, 0), d=(8, 0), reps=reps))
        assert d.desired[P] == 4, t
    assert pl.plan(observation(95.0, rate=8.0, p=(4, 0), d=(8, 0))).desired[P] == 2
    # a forecast of 20k tok/s at t = 30 (floor 3, each window read as it is; the fit check
    # allows only 4 at that tick) bounds the fast path for `floor_hold_s` (default: the 600 s
    # window): 4 until the fit minute has passed, 3 at t = 95
    pl = planner(policy(down_s=600.0))
    for t in range(0, 95, 5):
        d = pl.plan(observation(float(t), rate=20.0 if t == 30 else 8.0, p=(4, 0), d=(8, 0)))
        assert d.desired[P] == 4, t
    d = pl.plan(observation(95.0, rate=8.0, p=(4, 0), d=(8, 0)))
    assert d.desired[P] == 3 and d.reasons[P] == "sustained-fit"
    # read as the last 30 s' mean (`level_window_s` 30), that tick is (5 * 8 + 20) / 6 = 10 rps ->
    # floor ceil(10k / 8k) = 2, and 10k <= 0.8 * 2 * 8k fits 2: down to 2 at t = 60
    pl = planner(policy(down_s=600.0), level_window_s=30.0)
    for t in range(0, 60, 5):
        d = pl.plan(observation(float(t), rate=20.0 if t == 30 else 8.0, p=(4, 0), d=(8, 0)))
        assert d.desired[P] == 4, t
    d = pl.plan(observation(60.0, rate=8.0, p=(4, 0), d=(8, 0)))
    assert d.desired[P] == 2 and d.reasons[P] == "sustained-fit"


def test_floor_and_reactive_terms_read_the_load_as_the_last_30_s_mean() -> None:
    # five 5 s windows at 8 rps, then one at 20 rps: the terms read the windows that started
    # within the last 30 s, (5 * 8 + 20) / 6 = 10 rps (the t = 5 window began 35 s ago).
    # floor ceil(10k / 8k) = 2, not the spike's ceil(20k / 8k) = 3; the reactive steady need
    # ceil(10k / 10k raw) = 1, not 2
    assert pinned_planner(policy(), LinearPerfModel()).level_window_s == 0.0  # off by default
    pl = planner(level_window_s=30.0)
    for t in range(5, 35, 5):
        pl.plan(observation(float(t), rate=8.0, p=(4, 0), d=(8, 0)))
    d = pl.plan(observation(35.0, rate=20.0, p=(4, 0), d=(8, 0)))
    assert d.details["prefill"]["floor_inputs"]["rate_rps"] == pytest.approx(10.0)
    assert d.details["prefill"]["floor"] == 2
    assert d.details["prefill"]["reactive"] == 1
    # a queue is read as it is: 30k tokens on 4 replicas is backlog the mean does not hide
    q = replicas(P, 4, queued_prefill_tokens=30_000)
    d = pl.plan(observation(40.0, rate=8.0, p=(4, 0), d=(8, 0), reps=q))
    assert d.details["prefill"]["reactive_inputs"]["queued_tokens"] == 120_000.0


class AheadForecaster(EwmaForecaster):
    """8 rps now; `ahead` rps at 120 s (set by the test between ticks)."""

    ahead = 8.0

    def forecast(self, horizon_s: float) -> LoadForecast:
        return LoadForecast(8.0 if horizon_s < 60.0 else self.ahead, 1000.0, 200.0, 0.0)


def _fast_path(**options: Any) -> dict[int, int]:
    """4 prefill replicas at 8 rps (the fit check allows 2 at every tick: 8k <= 0.8 * 2 * 8k);
    at t = 30 alone the forecast for +120 s is 24 rps: a floor of 24k / 8k = 3."""
    fc = AheadForecaster(alpha=1.0)
    pl = planner(policy(down_s=600.0), forecaster=fc, trend_cap=3.0, trend_hold_s=0.0, **options)
    out = {}
    for t in range(0, 135, 5):
        fc.ahead = 24.0 if t == 30 else 8.0
        out[t] = pl.plan(observation(float(t), rate=8.0, p=(4, 0), d=(8, 0))).desired[P]
    return out


def test_fast_scale_down_is_bounded_by_the_floors_of_the_last_90_s() -> None:
    # the fit minute is whole at t = 60 (it allows 2); the t = 30 floor of 3 bounds the fast
    # path for `floor_hold_s` 90 s, to t = 120, not for the 600 s scale-down window (the
    # default, `scale_down_s`, keeps it to t = 130)
    # (`ahead_hold_s=None`: a floor for the load ahead holds as long as one for the load now)
    held = _fast_path(floor_hold_s=90.0, ahead_hold_s=None)
    assert held[55] == 4 and held[60] == held[120] == 3 and held[125] == 2
    assert _fast_path(ahead_hold_s=None)[130] == 3  # the whole window
    # this tick's floor alone: the t = 30 raw count of 3 is the fit minute's bound, to t = 90
    assert _fast_path(floor_hold_s=0.0, ahead_hold_s=None)[95] == 2 and held[95] == 3


def test_a_floor_for_the_load_ahead_bounds_the_fast_path_only_ahead_hold_s() -> None:
    # the t = 30 floor of 3 is sized for +120 s; the floor for the load now is 8k / 8k = 1.
    # `ahead_hold_s` 0: only the fit minute's raw count of 3 (t = 30) holds, to t = 90; the
    # default (as long as `floor_hold_s`, the 600 s window) holds it to t = 130
    short = _fast_path(ahead_hold_s=0.0)
    assert short[55] == 4 and short[60] == short[90] == 3 and short[95] == 2
    assert _fast_path()[130] == 3
    # the floor for the load now still holds `floor_hold_s`: 20 rps at t = 30 (floor 3 now)
    pl = planner(policy(down_s=600.0), ahead_hold_s=0.0)
    for t in range(0, 135, 5):
        d = pl.plan(observation(float(t), rate=20.0 if t == 30 else 8.0, p=(4, 0), d=(8, 0)))
    assert d.desired[P] == 3


def test_decode_fit_check_reads_the_floors_model_on_the_observed_load() -> None:
    # 18 rps, 1000 + 200 tokens: the floor's Little's law 18 * (0.1 + 200 * 0.05) = 181.8 seqs
    # over 100 per replica -> floor 2. 5 decode replicas hold 10 seqs each (they run at 14 ms,
    # not at the target): the observed check fits 2 (25 seqs -> 20 ms <= 0.8 * 50 ms); the
    # floor's model with margin 0.8 needs 181.8 / 80 = 2.27 -> 3
    reps = replicas(D, 5, num_running=10)
    obs = observation(rate=18.0, p=(8, 0), d=(5, 0), reps=reps)
    old = planner().plan(obs)  # the default
    assert old.details["decode"]["floor"] == 2 and old.desired[D] == 2
    new = planner(decode_fit_as_floor=True).plan(obs)
    assert new.desired[D] == 3 and new.reasons[D] == "consolidation"


def test_budget_keeps_the_provisioned_fleet_when_it_starts_binding_by_hand() -> None:
    # Round 12's whole-Mooncake trade: the fleet is P 9 (one pending) + D 7 = 16, then one
    # window's ITL breach makes decode want 8. Fresh split of (9, 8) in 16: (8, 8), A = 8/9 =
    # 0.889; the fleet (9, 7) has A = 7/8 = 0.875: a gain of 0.014 <= 0.2, so with the option
    # the fleet stands (no drain of prefill's pending start for a decode cold start).
    def steps(keep_fleet: bool) -> CrossPoolSteps:
        return CrossPoolSteps(
            policy(budget=16),
            {},
            budget_margin=0.2,
            stand_in=True,
            move_stabilization=False,
            hysteresis_window_s=600.0,
            budget_keep_fleet=keep_fleet,
        )

    fleet = {P: 9, D: 7}
    for keep_fleet, expect in ((False, {P: 8, D: 8}), (True, {P: 9, D: 7})):
        desired, reasons = {P: 9, D: 8}, {P: "ttft-breach", D: "itl-breach"}
        steps(keep_fleet).apply_budget(desired, reasons, fleet)
        assert desired == expect
        assert reasons[D if keep_fleet else P] == "budget"
    # a fleet the fresh split beats by more than the margin does not stand: want P 14, D 4,
    # fleet (8, 4): fresh (12, 4) has A = 12/14 = 0.857 against 8/14 = 0.571
    desired = {P: 14, D: 4}
    steps(True).apply_budget(desired, {}, {P: 8, D: 4})
    assert desired == {P: 12, D: 4}
    # a fleet above a pool's want is no valid split: fresh
    desired = {P: 10, D: 7}
    steps(True).apply_budget(desired, {}, {P: 8, D: 8})
    assert desired == {P: 9, D: 7}
