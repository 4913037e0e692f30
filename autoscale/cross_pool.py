"""pdorch's planner, steps 6-7: the two steps that couple the pools (`autoscale.planner`).

Steps 0-5 size each pool on its own (floor, correction, reactive term, stabilization); these
two read both pools' counts at once and trade replicas between them, so they live apart from
the per-pool loop. Pure: every input is an argument, `now` included; the state is the last
binding budget split and the role mover's ledger.

6. **Budget** (`policy.gpu_budget`): split by marginal SLO gain (`autoscale.budget`); while it
   binds, the last split stands unless a fresh one gains more than `budget_margin` (0.2) in
   estimated attainment (0: a fresh split every tick). With `budget_keep_fleet` (on by
   default; false: the fresh split) the tick the budget *starts* binding keeps the fleet as
   provisioned (ready + pending per pool) by the same rule: it stands while it is a valid
   split (within the budget, each pool in [min, want]) and the fresh split gains at most
   `budget_margin`. Why:
   on the whole Mooncake trace (Round 12) the budget went from fitting (P 9 + D 7 = 16) to
   binding on one window's p90 ITL breach of decode (P wants 9, D 8); the fresh split chose
   8 + 8 (estimate 0.889 against the fleet's 0.875), cancelling prefill's pending cold start
   for a decode one, and 65 s later decode's fast way down cancelled its own: a drain-and-start
   trade that was 3 of the worst 10 minutes' 3 / 3 direction changes. With it: 0 / 1, +0.40
   points, -0.04 % GPU-h there; the Azure x14 prefix -3.1 % GPU-h at the same attainment; the
   Mooncake prefix and the 600 s day the same results (the budget seldom or never binds):
   on by default, as it won or tied everywhere it was measured
   (benchmarks/results/autoscale-round12-roles/). With `budget_now_first` (off by default)
   the needs for the load now are split first and the headroom ahead gets what is left
   (`autoscale.budget`, Round 13).
7. **Role switch** (`policy.role_switching`, equal GPUs per replica; `autoscale.role_moves`):
   a replica is lent from pool G to pool T when T is short *now* (its reactive term for
   replicas that serve within `switch_s`, or an observed breach, beyond its ready and arriving
   replicas), and only when G still meets its SLO over the next `startup_s` without it: G's slack =
   ready - max(its floor at now and now + `startup_s`, its reactive term, its consolidation
   count, min). A move also stands in for a cold start T is about to order (`stand_in`,
   default on: G's horizon slack is idle). T keeps ordering the cold starts its own count
   asks for beyond the move; when G later wants more and T has slack, the loan goes back to
   G (cancelling a cold start G had pending), and a pool that gave a replica back does not
   take one again within `scale_down_s` (no flapping). With `move_stabilization` (off by
   default) a move is a direction change of both pools: the giver gives only what its
   floor's need widened by `hysteresis` and its own way down (the largest raw count of the
   last `scale_down_s`) leave, both pools' stabilizers record it (their
   reversals then wait as a scale's do), and a borrow into a pool within
   `hysteresis_window_s` after it gave one back needs a breach of that pool now (Round 11).
   With `move_release_check` (off by default; implied by `move_stabilization`) only the
   giver check of that rule applies: whole Mooncake with switching 8 / 13 -> 0 / 1 direction
   changes in the worst 10 minutes, 95.06 % at 15.756 GPU-h (95.01 % / 15.760 without
   switching), but the stand-ins' GPU-hours go (Azure prefix +2.6 %, the 600 s day +2.1 %
   against plain switching): off (benchmarks/results/autoscale-round13-roles/).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autoscale.budget import split_budget
from autoscale.decision import RoleMove
from autoscale.policy import SloPolicy
from autoscale.predictive_floor import POOLS
from autoscale.role_moves import PoolView, RoleMover
from autoscale.signals import Pool
from autoscale.stabilization import PoolStabilizer

ViewOf = Callable[[Pool, int], PoolView]
"""`view_of(pool, desired)`: what the move rules read of one pool (built by the planner from
its terms, only when moves are possible)."""


class CrossPoolSteps:
    """Steps 6 and 7 of pdorch's planner, with their state (module docstring)."""

    def __init__(
        self,
        policy: SloPolicy,
        stabilizers: dict[Pool, PoolStabilizer],
        *,
        budget_margin: float,
        stand_in: bool,
        move_stabilization: bool,
        hysteresis_window_s: float,
        budget_keep_fleet: bool = True,
        move_release_check: bool = False,
        budget_now_first: bool = False,
    ) -> None:
        self.policy = policy
        # the pools' stabilizers, shared with the planner: move stabilization records a move
        # in both (rule (c) of `autoscale.role_moves`)
        self._stabilizers = stabilizers
        # while the budget binds, the last split stands unless a fresh one gains more than
        # this in estimated attainment (`autoscale.budget`)
        self.budget_margin = budget_margin
        self._budget_split: dict[Pool, int] | None = None
        # the tick the budget starts binding, the provisioned fleet is the split to keep
        self.budget_keep_fleet = budget_keep_fleet
        # the needs for the load now are split first, the headroom ahead from what is left
        self.budget_now_first = budget_now_first
        # role moves (`autoscale.role_moves`); stand_in=False: only bridge a shortage now;
        # with `move_stabilization` a move is held to the pools' reversal rules over the
        # hysteresis window (`autoscale.role_moves`, Round 11)
        self.move_stabilization = move_stabilization
        self.mover = RoleMover(
            hold_s=policy.stabilization.scale_down_s,
            stand_in=stand_in,
            reversal_window_s=hysteresis_window_s if move_stabilization else 0.0,
            release_check=move_release_check,
        )

    def apply_budget(
        self,
        desired: dict[Pool, int],
        reasons: dict[Pool, str],
        provisioned: dict[Pool, int] | None = None,
        now_need: dict[Pool, int] | None = None,
    ) -> None:
        """Step 6: cut `desired` to the GPU budget (in place; reason `budget` where cut);
        `provisioned` (ready + pending per pool) is the split kept when the budget starts
        binding, with `budget_keep_fleet`; `now_need` (each pool's need for the load now) is
        split first with `budget_now_first` (`autoscale.budget`)."""
        budget = self.policy.gpu_budget
        if budget is None:
            return
        gpus = {p: self.policy.limits(p).gpus_per_replica for p in POOLS}
        minimum = {p: self.policy.limits(p).min for p in POOLS}
        keep = self._budget_split
        if keep is None and self.budget_keep_fleet and provisioned is not None:
            keep = dict(provisioned)
        split = split_budget(
            desired,
            minimum,
            gpus,
            budget,
            keep if self.budget_margin > 0 else None,
            self.budget_margin,
            now_need if self.budget_now_first else None,
        )
        # the split is kept only while the budget binds; a tick it does not starts afresh
        self._budget_split = split if split != desired else None
        for p in POOLS:
            if split[p] < desired[p]:
                desired[p], reasons[p] = split[p], "budget"

    def role_moves(
        self,
        now: float,
        view_of: ViewOf,
        desired: dict[Pool, int],
        reasons: dict[Pool, str],
        details: dict[str, Any] | None = None,
    ) -> tuple[RoleMove, ...]:
        """Step 7: lend, return, hold loans (`autoscale.role_moves`); updates `desired` and
        `reasons` in place."""
        pol = self.policy
        if not pol.role_switching:
            return ()
        if pol.limits(Pool.PREFILL).gpus_per_replica != pol.limits(Pool.DECODE).gpus_per_replica:
            return ()
        views = {p: view_of(p, desired[p]) for p in POOLS}
        plan = self.mover.decide(now, views)
        if self.move_stabilization:
            for move in plan.moves:  # a direction change of both pools (rule (c))
                self._stabilizers[move.from_pool].record_move(now, up=False)
                self._stabilizers[move.to_pool].record_move(now, up=True)
        desired.update(plan.desired)
        reasons.update(plan.reasons)
        if details is not None:
            details["role_moves"] = plan.inputs
        return plan.moves
