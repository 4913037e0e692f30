"""`oracle`: the clairvoyant planner, the physical limit every planner is measured against.

It knows the trace. At each tick (`interval_s`, 30 s) it looks at the real load of the next
interval, cut into `sub_window_s` (10 s) pieces so a burst inside the interval is not averaged
away, and asks for the fewest replicas per pool that meet both SLO targets for the worst
piece, per the perf model (`autoscale.sizing.size_window`, no headroom, no correction).
Prefill is sized on each piece's arrivals. Decode is sized on the sequences in flight at the
start, middle and end `tau` of each piece: the arrivals of `[tau - R, tau)`, with
`R = t_own + OSL·ITL` the decode residence (OSL from the last `lookback_s`, 120 s), so
sequences that arrived before the piece and still decode in it count.
Then [min, max] and the GPU budget (`autoscale.budget`). That replicas start instantly is the
simulator's matter, not the oracle's.

Feed it the trace as `requests=[(arrival_s, isl, osl, hit), ...]` or `future=` a
`FutureLoad` `(start_s, end_s) -> LoadWindow` (`autoscale.load_window`). It reads only
`observation.now` and the pools of the observation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autoscale.baselines.common import POOLS, clamp
from autoscale.budget import split_budget
from autoscale.decision import ScaleDecision
from autoscale.load_window import FutureLoad, TraceRequest, future_from_requests
from autoscale.perf_model_base import PerfModel
from autoscale.planner_base import Planner, register_planner
from autoscale.policy import SloPolicy
from autoscale.signals import Observation, Pool
from autoscale.sizing import itl_target_s, size_window, ttft_target_s, uncached_tokens


class OraclePlanner(Planner):
    name = "oracle"

    def __init__(
        self,
        policy: SloPolicy,
        perf_model: PerfModel,
        *,
        future: FutureLoad | None = None,
        requests: Sequence[TraceRequest] | None = None,
        interval_s: float = 30.0,
        sub_window_s: float = 10.0,
        lookback_s: float = 120.0,
    ) -> None:
        if future is None:
            if requests is None:
                raise ValueError("oracle needs the future load: future= or requests=")
            future = future_from_requests(requests)
        self.policy = policy
        self.perf = perf_model
        self.future = future
        self.interval_s = interval_s
        self.sub_window_s = sub_window_s
        self.lookback_s = lookback_s

    def need(self, start_s: float, end_s: float) -> dict[Pool, int]:
        """Fewest replicas per pool for the real load of `[start_s, end_s)` (before limits)."""
        out = {p: 0 for p in POOLS}
        t = start_s
        while t < end_s - 1e-9:
            stop = min(end_s, t + self.sub_window_s)
            prefill = size_window(self.perf, self.policy, self.future(t, stop))[Pool.PREFILL]
            out[Pool.PREFILL] = max(out[Pool.PREFILL], prefill)
            for tau in (t, (t + stop) / 2.0, stop):
                out[Pool.DECODE] = max(out[Pool.DECODE], self._decode_at(tau))
            t = stop
        return out

    def _decode_at(self, tau: float) -> int:
        """Decode replicas for the sequences in flight at `tau`: those that arrived within one
        residence `R = t_own + OSL·ITL` before it (`R` from the last `lookback_s` of load)."""
        recent = self.future(tau - self.lookback_s, tau)
        if recent.arrival_rps <= 0:
            return 0
        isl_u = uncached_tokens(recent.mean_isl_tokens, recent.prefix_hit_rate)
        t_own = min(self.perf.prefill_time_s(isl_u), ttft_target_s(self.policy))
        residence = t_own + recent.mean_osl_tokens * itl_target_s(self.policy)
        in_flight = self.future(tau - residence, tau)
        return size_window(self.perf, self.policy, in_flight)[Pool.DECODE]

    def plan(self, observation: Observation) -> ScaleDecision:
        now = observation.now
        need = self.need(now, now + self.interval_s)
        desired: dict[Pool, int] = {}
        reasons: dict[Pool, str] = {}
        names = {Pool.PREFILL: "oracle-ttft", Pool.DECODE: "oracle-itl"}
        for p in POOLS:
            desired[p], reasons[p] = clamp(self.policy, p, need[p], names[p])
        if self.policy.gpu_budget is not None:
            gpus = {p: self.policy.limits(p).gpus_per_replica for p in POOLS}
            split = split_budget(
                desired, {p: self.policy.limits(p).min for p in POOLS}, gpus, self.policy.gpu_budget
            )
            for p in POOLS:
                if split[p] < desired[p]:
                    desired[p], reasons[p] = split[p], "budget"
        details: dict[str, Any] = {"need": {str(p): n for p, n in need.items()}}
        return ScaleDecision(now, desired, reasons, (), details)


register_planner("oracle", lambda policy, perf_model, **o: OraclePlanner(policy, perf_model, **o))
