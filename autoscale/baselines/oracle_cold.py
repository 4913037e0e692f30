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

    L = max r(t) over t in [τ + S, τ + S + tick_s)   where an order placed now lands
    K = max r(t) over t in [τ, τ + S + d]           what is cheaper kept than released
    desired = max(L, min(P, K))

Why this is the cheapest plan: a replica ordered at `τ` serves from `τ + S`, so an interval
starting at `t` needs its extra replicas ordered at `t - S`, no later, and ordering earlier
only pays more: new orders are sized by `L` alone (a need inside `(τ, τ + S)` that the fleet
does not already cover cannot be helped by an order now; it happens only before the first
orders land, and an order for it would be paid pending and then cancelled). A replica that the
need drops below at `t1` and wants again at `t2` costs `t2 - t1` kept, or `d` (its drain,
paid) `+ S` (the re-order, paid while pending) released: kept iff `t2 - t1 <= S + d`, the
break-even; `K` keeps every ready or pending replica some interval needs within `S + d`.
Read per unit layer of the need (the layer `j` is the time where `r(t) >= j`; replicas are
interchangeable), each gap of each layer is bridged or released on its own, so deciding every
gap by its break-even is the cheapest for the layer, and the `K` term decides exactly that: at
a gap's start its end lies within `S + d` or not. A released layer is not re-grown early: it
comes back through `L`, at `t2 - S`.

Parameters (options) and defaults:
- `grid_s` 30 s: the oracle's `interval_s`, so the needs are the oracle's own.
- `tick_s` = `policy.intervals.reactive_s` (5 s): pdorch's tick. With `S` = 120 s and the
  30 s grid on 5 s ticks, an order lands exactly at the interval that needs it (ticks that do
  not divide the grid order up to one tick early, never late).
- `drain_s` 5 s per pool (a float, or a dict per pool): what a released replica is paid
  while it drains. The simulator drains the least-loaded ready replica, measured in the
  oracle's Azure run at 0.03 s (prefill) and 1.4-2.2 s (decode); `drain_timeout_s` (300 s)
  is only the bound on it. Gaps on the 30 s grid are multiples of 30 s, so every `d` in
  (0, 30) gives the same plan: a dip of `S` = 120 s or less is kept, 150 s or more released.
- the oracle's options (`requests=`, `future=`, `start_s=`, `cap=`, `window_s`,
  `lookback_s`) pass through to the `OraclePlanner` that computes the needs; or `needs=` a
  sequence of per-interval needs `{Pool: int}` (interval `k` = index `k`; past its end the
  pools' min), for tests and replays.

Then the GPU budget (`autoscale.budget`, the oracle's split by marginal SLO gain) when the
desired counts do not fit. It reads only `observation.now` and
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
    tick_s: float,
) -> tuple[int, int, int]:
    """(desired, L, K) of one pool at `now` (module docstring): `need(k)` is the clamped
    need of grid interval `k`, `provisioned` the pool's ready + pending replicas."""
    lands = now + startup_s
    ahead = max(need(k) for k in grid_span(lands, lands + tick_s - 2 * _EPS, grid_s))
    keep = max(need(k) for k in grid_span(now, lands + drain_s, grid_s))
    return max(ahead, min(provisioned, keep)), ahead, keep


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
        details: dict[str, Any] = {}
        for p in POOLS:
            provisioned = observation.pools[p].provisioned
            desired[p], ahead, keep = cold_count(
                self._pool_need(p),
                now,
                provisioned,
                grid_s=self.grid_s,
                startup_s=self.policy.limits(p).startup_s,
                drain_s=self.drain_s[p],
                tick_s=self.interval_s,
            )
            # "keep": held above what an order now would be sized for (module docstring)
            reasons[p] = "oracle-cold-keep" if desired[p] > ahead else "oracle-cold-ahead"
            details[str(p)] = {"ahead": ahead, "keep": keep, "provisioned": provisioned}
        if self.policy.gpu_budget is not None:
            gpus = {p: self.policy.limits(p).gpus_per_replica for p in POOLS}
            split = split_budget(
                desired, {p: self.policy.limits(p).min for p in POOLS}, gpus, self.policy.gpu_budget
            )
            for p in POOLS:
                if split[p] < desired[p]:
                    desired[p], reasons[p] = split[p], "budget"
        return ScaleDecision(now, desired, reasons, (), details)


register_planner(
    "oracle-cold", lambda policy, perf_model, **o: OracleColdPlanner(policy, perf_model, **o)
)
