"""`llmd-slo`: llm-d's SLO-aware KEDA recipe, one ScaledObject per pool.

Source: llm-d's SLO-aware autoscaling recipe (KEDA ScaledObject + HPA behaviour) as
summarised in PEER-AUTOSCALERS.md §2; our own implementation.

- Signal: `s = avg over 45 s of min(max(p90 TTFT / S_ttft, p90 TPOT / S_tpot), 2.0)`, sampled
  every tick from the observation's p90s (`S_*` = the policy's TTFT/ITL targets).
- Replicas, with `n` provisioned, `r` ready and the in-flight credit `c = r/n` (up only):
  `s > 0.55`: `d = n + ceil(n·(s·c/0.55 - 1))` (never below n);
  `s < 0.40`: `d = n - floor(n·(1 - s/0.40))`; otherwise `d = n`.
- HPA behaviour: up max(100 %, 4 pods) per 60 s with a 30 s stabilization window; down
  1 pod per 120 s with a 180 s window (`hpa_behavior`); then [min, max]. HPA sync 15 s.

**Per pool.** Upstream scales one aggregated pool on the max of both ratios; P/D adaptation is
listed as future work. Applied to a P/D fleet, the prefill pool is driven by TTFT (it is what
prefill capacity moves) and the decode pool by TPOT (= our per-request mean ITL):
`s_prefill = min(p90 TTFT/S_ttft, 2)`, `s_decode = min(p90 TPOT/S_tpot, 2)`. With
`combined=True` both pools use upstream's `min(max(both), 2)` instead. A window without
finished requests gives no sample (Prometheus returns no data); with no sample in 45 s the
signal is 0 (idle).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from autoscale.baselines.common import POOLS, held_decision, hpa_step, per_pool_decision
from autoscale.baselines.hpa_behavior import Behavior, HpaController, RatePolicy
from autoscale.decision import ScaleDecision
from autoscale.perf_model_base import PerfModel
from autoscale.planner_base import Planner, register_planner
from autoscale.policy import SloPolicy
from autoscale.signals import Observation, Pool
from autoscale.sizing import itl_target_s, ttft_target_s

LLMD_BEHAVIOR = Behavior(
    up_window_s=30.0,
    up=(RatePolicy("percent", 100, 60), RatePolicy("pods", 4, 60)),
    down_window_s=180.0,
    down=(RatePolicy("pods", 1, 120),),
)


def llmd_replicas(s: float, n: int, ready: int, up: float = 0.55, down: float = 0.40) -> int:
    """The recipe's desired replicas for signal `s` (module docstring)."""
    if n <= 0:
        return 1 if s > up else 0
    if s > up:
        c = ready / n
        return max(n, n + math.ceil(n * (s * c / up - 1.0) - 1e-9))
    if s < down:
        return n - math.floor(n * (1.0 - s / down) + 1e-9)
    return n


class LlmdSloPlanner(Planner):
    name = "llmd-slo"

    def __init__(
        self,
        policy: SloPolicy,
        perf_model: PerfModel,
        *,
        up_threshold: float = 0.55,
        down_threshold: float = 0.40,
        signal_cap: float = 2.0,
        average_s: float = 45.0,
        percentile: float = 90.0,
        sync_s: float = 15.0,
        combined: bool = False,
        behavior: Behavior | None = None,
    ) -> None:
        self.policy = policy
        self.up, self.down, self.cap = up_threshold, down_threshold, signal_cap
        self.average_s = average_s
        self.percentile = percentile
        self.interval_s = sync_s
        self.combined = combined
        self.hpa = {p: HpaController(behavior or LLMD_BEHAVIOR) for p in POOLS}
        self._samples: dict[Pool, deque[tuple[float, float]]] = {p: deque() for p in POOLS}
        self._last: ScaleDecision | None = None

    def _sample(self, obs: Observation) -> None:
        t = obs.ttft.percentile(self.percentile)
        i = obs.itl.percentile(self.percentile)
        rt = t / ttft_target_s(self.policy) if t is not None and obs.ttft.count else None
        ri = i / itl_target_s(self.policy) if i is not None and obs.itl.count else None
        both = max((x for x in (rt, ri) if x is not None), default=None)
        per_pool = {Pool.PREFILL: rt, Pool.DECODE: ri}
        for p in POOLS:
            value = both if self.combined else per_pool[p]
            if value is not None:
                self._samples[p].append((obs.now, min(value, self.cap)))
            while self._samples[p] and obs.now - self._samples[p][0][0] > self.average_s:
                self._samples[p].popleft()

    def signal(self, pool: Pool) -> float:
        samples = self._samples[pool]
        return sum(v for _, v in samples) / len(samples) if samples else 0.0

    def plan(self, observation: Observation) -> ScaleDecision:
        obs = observation
        self._sample(obs)
        held = held_decision(self._last, obs.now, self.interval_s)
        if held is not None:
            return held

        def step(p: Pool) -> tuple[int, str, dict[str, Any]]:
            st = obs.pool(p)
            s = self.signal(p)
            rec = llmd_replicas(s, st.provisioned, st.ready, self.up, self.down)
            n, why = hpa_step(self.policy, self.hpa[p], p, obs.now, st.provisioned, rec)
            return n, why, {"signal": s, "recommendation": rec}

        self._last = per_pool_decision(obs.now, step)
        return self._last


register_planner(
    "llmd-slo", lambda policy, perf_model, **o: LlmdSloPlanner(policy, perf_model, **o)
)
