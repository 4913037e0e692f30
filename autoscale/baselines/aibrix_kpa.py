"""`aibrix-kpa`: AIBrix's KPA (Knative-style pod autoscaler), one per pool.

Source: vllm-project/aibrix `pkg/controller/podautoscaler` (KPA algorithm and annotations) and
Knative's KPA docs, as summarised in PEER-AUTOSCALERS.md §3/§5; our own implementation.

Every tick (`tick_s` 2 s, Knative's autoscaler tick) the pool's total metric over its ready
replicas is sampled. With `stable` / `panic` the means of the samples of the last 60 s / 6 s
and `target` the per-pod target:
- `dspc = ceil(stable / target)`, `dppc = ceil(panic / target)`, each clamped to
  `[floor(N / max_scale_down_rate), ceil(max_scale_up_rate · N)]` (rates 2, 2), `N` = ready
  replicas (1 when none).
- Panic starts (or is extended) when `dppc / N ≥ 2.0`; it ends once `stable_window_s` has
  passed since it was last triggered. In panic the desired count is `max(dppc, previous)`
  (it only grows); otherwise it is `dspc`. Then [min, max].

Metric (same as `hpa-kv-util`, for a like-for-like comparison): decode = KV-cache usage
(`gpu_cache_usage_perc`, 0..1) with target 0.70 per pod; prefill = waiting requests
(`vllm:num_requests_waiting`) with target 3 per pod. AIBrix's `scale-down-cooldown-window`
annotation is an option (`scale_down_delay_s`, default 0: the KPA's stable window already
delays scale-down; the docs say the sample's `scale-down-delay` annotation is ignored).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from autoscale.baselines.common import POOLS, clamp, pool_metric
from autoscale.decision import ScaleDecision
from autoscale.perf_model_base import PerfModel
from autoscale.planner_base import Planner, register_planner
from autoscale.policy import SloPolicy
from autoscale.signals import Observation, Pool


class _PoolKpa:
    def __init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque()
        self.panic_since: float | None = None
        self.desired: int | None = None
        self.above_since: float | None = None  # for the scale-down delay


class AibrixKpaPlanner(Planner):
    name = "aibrix-kpa"

    def __init__(
        self,
        policy: SloPolicy,
        perf_model: PerfModel,
        *,
        kv_target: float = 0.70,
        prefill_waiting_target: float = 3.0,
        stable_window_s: float = 60.0,
        panic_window_s: float = 6.0,
        panic_threshold: float = 2.0,
        max_scale_up_rate: float = 2.0,
        max_scale_down_rate: float = 2.0,
        tick_s: float = 2.0,
        scale_down_delay_s: float = 0.0,
    ) -> None:
        self.policy = policy
        self.targets = {Pool.DECODE: kv_target, Pool.PREFILL: prefill_waiting_target}
        self.stable_window_s = stable_window_s
        self.panic_window_s = panic_window_s
        self.panic_threshold = panic_threshold
        self.up_rate = max_scale_up_rate
        self.down_rate = max_scale_down_rate
        self.interval_s = tick_s
        self.scale_down_delay_s = scale_down_delay_s
        self.state = {p: _PoolKpa() for p in POOLS}

    def _mean(self, st: _PoolKpa, now: float, window: float) -> float:
        vals = [v for t, v in st.samples if now - t <= window]
        return sum(vals) / len(vals) if vals else 0.0

    def _pool(self, obs: Observation, pool: Pool) -> tuple[int, str, dict[str, Any]]:
        st = self.state[pool]
        now = obs.now
        st.samples.append((now, sum(pool_metric(obs, pool))))
        while st.samples and now - st.samples[0][0] > self.stable_window_s:
            st.samples.popleft()
        target = self.targets[pool]
        n = max(1, obs.pool(pool).ready)
        lo, hi = math.floor(n / self.down_rate), math.ceil(self.up_rate * n)
        stable = self._mean(st, now, self.stable_window_s)
        panic = self._mean(st, now, self.panic_window_s)
        dspc = min(hi, max(lo, math.ceil(stable / target - 1e-9)))
        dppc = min(hi, max(lo, math.ceil(panic / target - 1e-9)))
        if dppc / n >= self.panic_threshold:
            st.panic_since = now
        elif st.panic_since is not None and now - st.panic_since >= self.stable_window_s:
            st.panic_since = None
        if st.panic_since is not None:
            want, why = max(dppc, st.desired or 0), "panic"
        else:
            want, why = dspc, "stable"
        current = obs.pool(pool).provisioned
        if want < current and self.scale_down_delay_s > 0:
            st.above_since = now if st.above_since is None else st.above_since
            if now - st.above_since < self.scale_down_delay_s:
                want, why = current, "cooldown"
        else:
            st.above_since = None
        want, why = clamp(self.policy, pool, want, why)
        st.desired = want
        return want, why, {"stable": stable, "panic": panic, "dspc": dspc, "dppc": dppc}

    def plan(self, observation: Observation) -> ScaleDecision:
        desired: dict[Pool, int] = {}
        reasons: dict[Pool, str] = {}
        details: dict[str, Any] = {}
        for p in POOLS:
            desired[p], reasons[p], details[str(p)] = self._pool(observation, p)
        return ScaleDecision(observation.now, desired, reasons, (), details)


register_planner(
    "aibrix-kpa", lambda policy, perf_model, **o: AibrixKpaPlanner(policy, perf_model, **o)
)
