"""`hpa-kv-util`: the Kubernetes HPA on a per-pod utilisation metric, one HPA per pool.

Formula (Kubernetes HPA algorithm, `hpa_behavior.metric_recommendation`):
`desired = ceil(N · mean(metric) / target)` when `|mean/target - 1| > tolerance`, pods not
ready filled in at 0 (up) / 100 % (down); then stabilization (scale-down takes the maximum
recommendation of the last 300 s, scale-up the minimum of the last 0 s) and HPA's default
rate policies (up max(100 %, 4 pods) per 15 s, down 100 % per 15 s); then [min, max].
The HPA sync period is 15 s (`interval_s`; in between the last decision holds).

Metrics (what HPA users of vLLM scale on):
- decode: KV-cache usage (`vllm:kv_cache_usage_perc`), target 0.70 (`kv_target`).
- prefill: KV usage is meaningless there (a prefill replica frees the KV once it is pulled),
  so it uses the queue size `vllm:num_requests_waiting`, an `AverageValue` target of 3
  waiting requests per pod (`prefill_waiting_target`), the metric GKE's best-practice guide
  for LLM inference recommends for throughput-oriented scaling.

Source: kubernetes.io "Horizontal Pod Autoscaling" (algorithm, tolerance 0.1, 300 s
scale-down stabilization, sync 15 s, default behavior); GKE "Best practices for autoscaling
LLM inference workloads" (queue size / KV-cache metrics). Needs `Observation.replicas`.
"""

from __future__ import annotations

from typing import Any

from autoscale.baselines.common import (
    POOLS,
    held_decision,
    hpa_step,
    per_pool_decision,
    pool_metric,
)
from autoscale.baselines.hpa_behavior import Behavior, HpaController, metric_recommendation
from autoscale.decision import ScaleDecision
from autoscale.perf_model_base import PerfModel
from autoscale.planner_base import Planner, register_planner
from autoscale.policy import SloPolicy
from autoscale.signals import Observation, Pool


class HpaKvUtilPlanner(Planner):
    name = "hpa-kv-util"

    def __init__(
        self,
        policy: SloPolicy,
        perf_model: PerfModel,
        *,
        kv_target: float = 0.70,
        prefill_waiting_target: float = 3.0,
        tolerance: float = 0.1,
        sync_s: float = 15.0,
        behavior: Behavior | None = None,
    ) -> None:
        self.policy = policy
        self.targets = {Pool.DECODE: kv_target, Pool.PREFILL: prefill_waiting_target}
        self.tolerance = tolerance
        self.interval_s = sync_s
        self.hpa = {p: HpaController(behavior or Behavior()) for p in POOLS}
        self._last: ScaleDecision | None = None

    def plan(self, observation: Observation) -> ScaleDecision:
        obs = observation
        held = held_decision(self._last, obs.now, self.interval_s)
        if held is not None:
            return held

        def step(p: Pool) -> tuple[int, str, dict[str, Any]]:
            status = obs.pool(p)
            values = pool_metric(obs, p)
            current = status.provisioned
            rec = metric_recommendation(
                values, status.pending, self.targets[p], current, self.tolerance
            )
            n, why = hpa_step(self.policy, self.hpa[p], p, obs.now, current, rec)
            return n, why, {"metric": values, "target": self.targets[p], "recommendation": rec}

        self._last = per_pool_decision(obs.now, step)
        return self._last


register_planner(
    "hpa-kv-util", lambda policy, perf_model, **o: HpaKvUtilPlanner(policy, perf_model, **o)
)
