"""Role moves between the prefill and decode pools: when to lend a replica, when to return it.

A move costs seconds (the giver's in-flight work drains, then `switch_s`), a cold start costs
`startup_s`. A move is worth it when the taker is short **now** (a cold start asked for now
lands too late: a bridge) or about to cold-start (a stand-in: the giver's idle replica replaces
a paid start-up), and only when the giver can spare the replica until a cold start of its own
could land.
Pure: `RoleMover.decide(now, views)` reads one `PoolView` per pool (built by the planner from
its terms) and keeps a small ledger of its own moves (the loans outstanding, when each
direction last moved, the moves not landed yet).

Per pool `X` (all counts are replicas):

- `slack(X) = ready - max(ahead, now, keep, min)`: what `X` can give and still meet its SLO
  over the next `startup_s`, the time a cold start of its own would take if it ran short:
  `ahead` is its predictive floor (the forecast need at now and at now + `startup_s`), `now`
  its reactive term (the observed window's queue / concurrency / KV needs), `keep` its
  consolidation count (the fewest replicas the observed load fits on with margin; `ready`
  while its percentile breaches, so a breaching pool never gives).
- `short_now(X) = max(urgent - ready, 1 if X breaches) - arriving`: what `X` lacks *now*:
  `urgent` is its reactive term sized for replicas that serve within `switch_s` (the queue
  drained within the TTFT budget, not over a cold start), `arriving` the replicas moved to it
  in the last `settle_s` (30 s) that have not landed yet (at most its pending count). Cold
  starts already pending do not reduce it: they serve `startup_s` after being asked for.
- `wants(X) = max(desired - ready - arriving, short_now)`: the replicas `X` is about to cold
  start (or has pending) or lacks now.

Rules, in order, each tick (`hold_s` = the policy's scale-down window, 180 s by default):

1. **Return**: a loan `G -> T` outstanding, `wants(G) >= 1` and `slack(T) >= 1`: move
   `r = min(loan, slack(T), wants(G))` back `T -> G`. The returned replica stands in for a
   cold start of G (G's desired is unchanged, at least its ready + arriving + `r`, so the
   actuator cancels one G had pending or does not start it): the pool does not grow twice
   for one shortage. A loan G never asks
   back stays with T, whose own scale-down rules then decide (a permanent move: G's slack at
   its horizon was idle capacity).
2. **Borrow**: `slack(G) >= 1`, T lacks replicas, no loan `T -> G` outstanding (rule 1
   settles that one) and no move `T -> G` in the last `hold_s` (no flapping: a pool that
   just gave a replica back does not take one again at once): move
   `c = min(max(short_now(T), desired(T) - provisioned(T)), slack(G), max(T) - ready(T) -
   arriving(T))` from G to T, i.e. what T lacks now (**bridge**: capacity within seconds, not
   `startup_s`) or the cold starts T is about to order (**stand-in**: the giver's horizon
   slack is idle capacity, so a move replaces a cold start and its `startup_s` of paid
   waiting). G's desired drops by `c`; T's is at least its provisioned + `c` (its own terms,
   sized on cold starts, may ask for fewer than the urgent count; the moved replicas are
   never drained or cancelled on landing). The cold starts T's own count asks for beyond `c`
   are still ordered. `stand_in=False` keeps only the bridge.

A pool with no slack at its horizon never gives: giving would make it short before a cold
start of its own could land (what stripped decode bare on the Azure trace at 6f9cb98, whose
giver check read only the current need: 76.9 %).

**Move stabilization** (`reversal_window_s` > 0: the planner's `move_stabilization`, its
`hysteresis_window_s`; 0, the default here: off). A move is a direction change of both pools
(the giver down, the taker up), so it is held to the rules a scale is: (a) the giver's slack
(a lender's, and a borrower's that returns) also clears `PoolView.hold`: its floor's need
widened by the hysteresis band (`ceil(need·(1+h))`) and the count its own slow way down
would hold it at (the largest raw count of the last `scale_down_s`,
`PoolStabilizer.down_limit`), so a need that hovers at the edge, or came back within the
window, does not give a replica it wants back at the next noisy tick; (b) a **borrow** into
pool X within `reversal_window_s` after X last gave one (a return) is refused unless X
breaches now (its observed percentile is over target): a re-borrow on a forecast alone is a
flap (a return is not refused: when the lender's need comes back while the budget binds, a
refused return becomes a budget trade, a drain of the borrower and a cold start of the
lender, the same reversal at `startup_s`; (a) already keeps a borrower that needed the
replica within `scale_down_s` from returning it); and (c) the planner records the
move in both pools' stabilizers (`PoolStabilizer.record_move`), so the giver's next up and the
taker's next down are reversals under hysteresis and persistence. Why: on the whole Mooncake
trace with switching (Round 10, 10 / 9 direction changes in the worst 10 minutes) a 230 s
cycle repeated: decode lent at slack 1 (floor 5 of 6 ready) to a breaching prefill; one tick
later decode's floor read 6 (noise), the budget cut prefill back and decode ordered a cold
start; 15 s later prefill's breach had passed, its one-tick slack returned the loan (cancelling
decode's cold start), and 15 s after that prefill breached again and cold-started
(benchmarks/results/autoscale-round11-roles/README.md).

**Release check** (`release_check`: the planner's `move_release_check`, off by default; implied
by move stabilization): rule (a) alone, without (b) and (c). A lender gives, and a borrower
returns, only what its own way down would release anyway: ready minus its floor's widened
need and minus the largest raw count of its last `scale_down_s` (`PoolView.hold`), so a lend
is never the replica the giver's next noisy tick asks back, and a loan goes back only once
the borrower's own need has stayed below it for the window (its cold starts landed or its
burst passed). Re-borrows are not refused and the stabilizers are not told of moves. Why: on
the Mooncake prefix with switching, decode lent its third replica at slack 1 (floor 3 of 4
ready) at 275 s, read 4 at 280 s (noise), the budget cut prefill for a decode start, and a
one-tick prefill slack (floor 7 of 12 ready, 15 s after its breach) returned two loans at
290-295 s, after which prefill breached again at 300 s: 8 / 10 direction changes in the worst
10 minutes (benchmarks/results/autoscale-round13-roles/).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoscale.decision import RoleMove
from autoscale.signals import Pool

SETTLE_S = 30.0  # a moved replica drains (a decode one: its longest running output) + switch_s


def other(pool: Pool) -> Pool:
    return Pool.DECODE if pool is Pool.PREFILL else Pool.PREFILL


@dataclass(frozen=True, slots=True)
class PoolView:
    """One pool at a tick, as the move rules read it (module docstring)."""

    ready: int
    pending: int
    desired: int  # the planner's count after stabilization and budget, before moves
    ahead: int  # predictive floor: the forecast need over [now, now + startup_s]
    now: int  # reactive term at the pool's startup_s
    urgent: int  # reactive term for replicas that serve within switch_s
    keep: int  # consolidation count (ready when the observed load fits on none fewer)
    minimum: int
    maximum: int
    breach: bool  # the observed percentile is over target
    hold: int = 0  # move stabilization: the widened floor need and the way-down count

    @property
    def provisioned(self) -> int:
        return self.ready + self.pending


@dataclass(slots=True)
class MovePlan:
    """The moves of one tick and the desired counts after them, with the reasons changed."""

    moves: tuple[RoleMove, ...]
    desired: dict[Pool, int]
    reasons: dict[Pool, str]
    inputs: dict[str, dict[str, int]] = field(default_factory=dict)


class RoleMover:
    """The rules of the module docstring, with the ledger of this planner's own moves."""

    def __init__(
        self,
        *,
        hold_s: float,
        settle_s: float = SETTLE_S,
        stand_in: bool = True,
        reversal_window_s: float = 0.0,
        release_check: bool = False,
    ) -> None:
        self.hold_s = hold_s
        # rule (a) alone (`release_check`): a giver gives only what its own way down would
        # release; move stabilization implies it (module docstring, "Release check")
        self.release_check = release_check or reversal_window_s > 0
        self.stand_in = stand_in
        self.settle_s = settle_s
        self.reversal_window_s = reversal_window_s  # move stabilization (docstring); 0: off
        self.refused = 0  # moves refused by rule (b), for the planner's details
        self.loans: dict[tuple[Pool, Pool], int] = {}  # (lender, borrower) -> replicas
        self.moved_at: dict[tuple[Pool, Pool], float] = {}  # (from, to) -> last move time
        self._recent: list[tuple[float, Pool, int]] = []  # (t, to_pool, count)

    # -- the two quantities ----------------------------------------------------------------
    @staticmethod
    def slack(v: PoolView, banded: bool = False) -> int:
        """`banded`: move stabilization's rule (a), the hysteresis-widened need counts too."""
        hold = v.hold if banded else 0
        return max(0, v.ready - max(v.ahead, hold, v.now, v.keep, v.minimum))

    def _slack(self, v: PoolView) -> int:
        return self.slack(v, self.release_check)

    def reverses(self, now: float, to_pool: Pool, v: PoolView) -> bool:
        """Rule (b) of move stabilization: a borrow into `to_pool` within the window after it
        last gave one, with no breach of its own now."""
        if self.reversal_window_s <= 0 or v.breach:
            return False
        gave = self.moved_at.get((to_pool, other(to_pool)))
        return gave is not None and now - gave < self.reversal_window_s

    def arriving(self, now: float, pool: Pool, v: PoolView) -> int:
        moved = sum(c for t, p, c in self._recent if p is pool and now - t < self.settle_s)
        return min(moved, v.pending)

    def short_now(self, now: float, pool: Pool, v: PoolView) -> int:
        lack = max(v.urgent - v.ready, 1 if v.breach else 0)
        return max(0, lack - self.arriving(now, pool, v))

    # -- one tick ------------------------------------------------------------------------
    def decide(self, now: float, views: dict[Pool, PoolView]) -> MovePlan:
        self._recent = [x for x in self._recent if now - x[0] < self.settle_s]
        desired = {p: v.desired for p, v in views.items()}
        reasons: dict[Pool, str] = {}
        inputs = {
            str(p): {
                "slack": self._slack(v),
                "short_now": self.short_now(now, p, v),
                "arriving": self.arriving(now, p, v),
                "wants": self.wants(now, p, v),
                "on_loan": self.loans.get((other(p), p), 0),
            }
            for p, v in views.items()
        }
        for (lender, borrower), loan in list(self.loans.items()):
            # a loan cannot outlive the borrower's replicas (a scale-down took them)
            loan = min(loan, views[borrower].provisioned)
            self.loans[(lender, borrower)] = loan
        move = self._return(now, views, desired, reasons) or self._borrow(
            now, views, desired, reasons
        )
        return MovePlan(() if move is None else (move,), desired, reasons, inputs)

    def wants(self, now: float, pool: Pool, v: PoolView) -> int:
        return max(v.desired - v.ready - self.arriving(now, pool, v), self.short_now(now, pool, v))

    def _record(self, now: float, move: RoleMove) -> None:
        self.moved_at[(move.from_pool, move.to_pool)] = now
        self._recent.append((now, move.to_pool, move.count))

    def _return(
        self,
        now: float,
        views: dict[Pool, PoolView],
        desired: dict[Pool, int],
        reasons: dict[Pool, str],
    ) -> RoleMove | None:
        for (lender, borrower), loan in self.loans.items():
            if loan <= 0:
                continue
            t, g = views[borrower], views[lender]
            r = min(loan, self._slack(t), self.wants(now, lender, g))
            if r <= 0:
                continue
            self.loans[(lender, borrower)] = loan - r
            desired[borrower] = min(desired[borrower], t.provisioned - r)
            # never below what G will hold once the replica lands (no drain on arrival)
            held = g.ready + self.arriving(now, lender, g) + r
            desired[lender] = min(g.maximum, max(desired[lender], held))
            reasons[borrower] = reasons[lender] = "role-return"
            move = RoleMove(borrower, lender, r)
            self._record(now, move)
            return move
        return None

    def _borrow(
        self,
        now: float,
        views: dict[Pool, PoolView],
        desired: dict[Pool, int],
        reasons: dict[Pool, str],
    ) -> RoleMove | None:
        for taker in (Pool.PREFILL, Pool.DECODE):
            giver = other(taker)
            t, g = views[taker], views[giver]
            if self.loans.get((taker, giver), 0) > 0:
                continue  # the giver owes the taker: rule 1 returns it when it can
            last = self.moved_at.get((taker, giver))
            if last is not None and now - last < self.hold_s:
                continue  # the taker just gave to the giver: no flapping
            room = t.maximum - t.ready - self.arriving(now, taker, t)
            lack = self.short_now(now, taker, t)
            if self.stand_in:
                lack = max(lack, t.desired - t.provisioned)
            c = min(lack, self._slack(g), room)
            if c <= 0:
                continue
            if self.reverses(now, taker, t):
                self.refused += 1
                continue
            desired[giver] = min(desired[giver], g.provisioned - c)
            desired[taker] = min(t.maximum, max(desired[taker], t.provisioned + c))
            reasons[giver] = "role-move"
            reasons[taker] = "role-move"
            self.loans[(giver, taker)] = self.loans.get((giver, taker), 0) + c
            move = RoleMove(giver, taker, c)
            self._record(now, move)
            return move
        return None
