"""`oracle-cold`: the clairvoyant planner that pays cold starts and drains like everyone else.

`oracle` (`autoscale/baselines/oracle.py`) is the bound with replicas that start instantly;
every other planner's replicas are pending for the pool's `startup_s` (120 s) and paid for
while pending, and a released replica is paid while it drains. `oracle-cold` is the cheapest
plan under those physics that still gives every interval the oracle's count: it measures how
much of a planner's GPU-hours above `oracle` no planner with cold starts can avoid.

Need. The same per-interval need as `oracle`: for each interval `k` of the oracle's grid
(`grid_s`, the oracle's `interval_s`, 30 s; `[k·grid_s, (k+1)·grid_s)`), `r_k[p] =
OraclePlanner.need(...)` (prefill replay, decode window + in-flight rule), clamped to the
pool's [min, max]. `r(t)` is `r_k` of the interval holding `t`.

Rule, per pool, at each tick `τ` (every `tick_s`, default the policy's `reactive_s`, 5 s, so
it can act whenever pdorch can), with `P` the provisioned count (ready + pending; draining ones
are leaving), `S = startup_s`, `d = drain_s`:

    U = max r(t) over t in [τ, τ + S]        what must be ready by the time an order lands
    K = max r(t) over t in [τ, τ + S + d]    what is cheaper kept than released
    desired = U            if P <= U          (order now: ready exactly S ahead of its need)
              min(P, K)    otherwise          (release only what no interval needs for S + d)

Why this is the cheapest plan: a replica ordered at `τ` serves from `τ + S`, so an interval
starting at `t` needs its extra replicas ordered at `t - S`, no later (the `U` term, which
also keeps the replicas pending for an interval inside the horizon); ordering earlier only
pays more. A replica that the need drops below at `t1` and wants again at `t2` costs `t2 - t1`
kept, or `d` (its drain, paid) `+ S` (the re-order, paid while pending) released: kept iff
`t2 - t1 <= S + d`, the break-even. Read per unit layer of the need (the layer `j` is the
time where `r(t) >= j`; replicas are interchangeable), each gap of each layer is bridged or
released on its own, so deciding every gap by its break-even is the cheapest for the layer,
and the `K` term decides exactly that: at a gap's start its end lies within `S + d` or not.
The rule never orders early for a released layer (then `P <= U` and it orders only at
`t2 - S`).

Parameters (options) and defaults:
- `grid_s` 30 s: the oracle's `interval_s`, so the needs are the oracle's own.
- `tick_s` = `policy.intervals.reactive_s` (5 s): pdorch's tick. With `S` = 120 s and the
  30 s grid on 5 s ticks, an order lands exactly at the interval that needs it.
- `drain_s` 5 s per pool (a float, or a dict per pool): what a released replica is paid
  while it drains. The simulator drains the least-loaded ready replica, measured in the
  oracle's Azure run at 0.03 s (prefill) and 1.4-2.2 s (decode); `drain_timeout_s` (300 s)
  is only the bound on it. Gaps on the 30 s grid are multiples of 30 s, so every `d` in
  (0, 30) gives the same plan: a dip of `S` = 120 s or less is kept, 150 s or more released.
- the oracle's options (`requests=`, `future=`, `start_s=`, `cap=`, `window_s`,
  `lookback_s`) pass through to the `OraclePlanner` that computes the needs; or `needs=` a
  sequence of per-interval needs `{Pool: int}` (interval `k` = index `k`; past its end the
  pools' min), for tests and replays.

Then the GPU budget (`autoscale.budget`): when the kept counts do not fit, the kept replicas
go first (`desired = U`), then the budget split of `U`. It reads only `observation.now` and
the pools of the observation. The runs' start fleet is the shared one (`runner.initial_fleet`)
and the first tick is at `tick_s`, so an opening ramp above that fleet is short until
`tick_s + S` (125 s) whatever the plan: `oracle-cold` is a bound in GPU-hours, and in
attainment only after its first orders land.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autoscale.baselines.common import POOLS, clamp
from autoscale.baselines.oracle import OraclePlanner
from autoscale.budget import split_budget
from autoscale.decision import ScaleDecision
from autoscale.perf_model_base import PerfModel
from autoscale.planner_base import Planner, register_planner
from autoscale.policy import SloPolicy
from autoscale.signals import Observation, Pool

_EPS = 1e-6  # ticks land on float sums of tick_s: 29.999999 is the grid point 30


def grid_span(start_s: float, end_s: float, grid_s: float) -> range:
    """Indices of the grid intervals `[k·grid_s, (k+1)·grid_s)` that `[start_s, end_s]`
    touches, both ends included (a replica ready at `end_s` serves the interval starting
    there)."""
    lo = max(0, math.floor((start_s + _EPS) / grid_s))
    hi = max(lo, math.floor((end_s + _EPS) / grid_s))
    return range(lo, hi + 1)


def cold_count(
    need: Callable[[int], int],
    now: float,
    provisioned: int,
    *,
    grid_s: float,
    startup_s: float,
    drain_s: float,
) -> tuple[int, int, int]:
    """(desired, U, K) of one pool at `now` (module docstring): `need(k)` is the clamped
    need of grid interval `k`, `provisioned` the pool's ready + pending replicas."""
    up = max(need(k) for k in grid_span(now, now + startup_s, grid_s))
    keep = max(need(k) for k in grid_span(now, now + startup_s + drain_s, grid_s))
    desired = up if provisioned <= up else min(provisioned, keep)
    return desired, up, keep


class OracleColdPlanner(Planner):
    name = "oracle-cold"

    def __init__(
        self,
        policy: SloPolicy,
        perf_model: PerfModel,
        *,
        needs: Sequence[Mapping[Pool, int]] | None = None,
        grid_s: float = 30.0,
        tick_s: float | None = None,
        drain_s: float | Mapping[Pool, float] = 5.0,
        **oracle_options: Any,
    ) -> None:
        self.policy = policy
        self.grid_s = grid_s
        self.interval_s = policy.intervals.reactive_s if tick_s is None else tick_s
        if isinstance(drain_s, Mapping):
            self.drain_s = {p: float(drain_s[p]) for p in POOLS}
        else:
            self.drain_s = {p: float(drain_s) for p in POOLS}
        self._given = None if needs is None else [dict(n) for n in needs]
        self.oracle: OraclePlanner | None = None
        if needs is None:
            self.oracle = OraclePlanner(policy, perf_model, interval_s=grid_s, **oracle_options)
        self._cache: dict[int, dict[Pool, int]] = {}

    def need(self, k: int) -> dict[Pool, int]:
        """The oracle's need of grid interval `k`, clamped to each pool's [min, max]."""
        hit = self._cache.get(k)
        if hit is not None:
            return hit
        if self._given is not None:
            raw = self._given[k] if k < len(self._given) else {}
            want = {p: raw.get(p, 0) for p in POOLS}
        else:
            assert self.oracle is not None
            want = self.oracle.need(k * self.grid_s, (k + 1) * self.grid_s)
        out = {p: clamp(self.policy, p, want[p], "")[0] for p in POOLS}
        self._cache[k] = out
        return out

    def _pool_need(self, pool: Pool) -> Callable[[int], int]:
        return lambda k: self.need(k)[pool]

    def plan(self, observation: Observation) -> ScaleDecision:
        now = observation.now
        desired: dict[Pool, int] = {}
        reasons: dict[Pool, str] = {}
        ahead: dict[Pool, int] = {}
        details: dict[str, Any] = {}
        for p in POOLS:
            provisioned = observation.pools[p].provisioned
            n, up, keep = cold_count(
                self._pool_need(p),
                now,
                provisioned,
                grid_s=self.grid_s,
                startup_s=self.policy.limits(p).startup_s,
                drain_s=self.drain_s[p],
            )
            desired[p], ahead[p] = n, up
            reasons[p] = "oracle-cold-keep" if n > up else "oracle-cold-ahead"
            details[str(p)] = {"ahead": up, "keep": keep, "provisioned": provisioned}
        if self.policy.gpu_budget is not None:
            gpus = {p: self.policy.limits(p).gpus_per_replica for p in POOLS}
            budget = self.policy.gpu_budget
            if sum(desired[p] * gpus[p] for p in POOLS) > budget:
                desired = dict(ahead)  # the kept replicas go first
                reasons = {p: "oracle-cold-ahead" for p in POOLS}
                split = split_budget(
                    desired, {p: self.policy.limits(p).min for p in POOLS}, gpus, budget
                )
                for p in POOLS:
                    if split[p] < desired[p]:
                        desired[p], reasons[p] = split[p], "budget"
        return ScaleDecision(now, desired, reasons, (), details)


register_planner(
    "oracle-cold", lambda policy, perf_model, **o: OracleColdPlanner(policy, perf_model, **o)
)
