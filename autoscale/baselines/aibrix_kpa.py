"""`aibrix-kpa`: AIBrix's KPA (Knative-style pod autoscaler), one per pool.

Source: vllm-project/aibrix `pkg/controller/podautoscaler` (KPA algorithm; annotation keys in
`pkg/controller/podautoscaler/types/annotations.go`), AIBrix's annotation table in
`docs/source/features/autoscaling/metric-based-autoscaling.rst` (defaults: max-scale-up/down
rate 2, scale-up/down tolerance 0.1, panic-threshold 2.0, scale-up-cooldown-window 0 s,
scale-down-cooldown-window **300 s**), and Knative's KPA docs, as summarised in
PEER-AUTOSCALERS.md §3/§5; our own implementation.

Every tick (`tick_s` 2 s, Knative's autoscaler tick) the pool's total metric over its ready
replicas is sampled. With `stable` / `panic` the means of the samples of the last 60 s / 6 s
and `target` the per-pod target:
- `dspc = ceil(stable / target)`, `dppc = ceil(panic / target)`, each clamped to
  `[floor(N / max_scale_down_rate), ceil(max_scale_up_rate · N)]` (rates 2, 2), `N` = ready
  replicas (1 when none).
- Panic starts (or is extended) when `dppc / N ≥ 2.0` (unclamped `dppc`); it ends once more
  than `stable_window_s` has passed since it was last triggered. In panic the desired count is
  the largest of the clamped `dspc`, `dppc` and every count since panic began (it only
  grows); otherwise it is the clamped `dspc`. Like Knative, a KPA created over more than one
  ready pod starts in panic at that count (it keeps the scale until it has a window of data).
- Outside panic, `tolerance` (AIBrix's scale-up/down-tolerance, 0.1): the stable count stays
  at `N` while `stable / (N · target)` is within `[1 - tolerance, 1 + tolerance]`.
- `scale_down_cooldown_s` (AIBrix's `autoscaling.aibrix.ai/scale-down-cooldown-window`,
  default 300 s; 0 = off, which is Knative's scale-down-delay default): the desired count is
  the maximum of the counts desired in the last `scale_down_cooldown_s`, the HPA
  stabilization semantics AIBrix's docs describe (its issue #2821 reports a build that took
  the minimum instead, making the window a no-op; we model the documented behaviour).
  The scale-up cooldown defaults to 0 s (no hold) and is not modelled. Then [min, max].

Metric (same as `hpa-kv-util`, for a like-for-like comparison): decode = KV-cache usage
(`gpu_cache_usage_perc`, 0..1) with target 0.70 per pod; prefill = waiting requests
(`vllm:num_requests_waiting`) with target 3 per pod.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from autoscale.baselines.common import POOLS, clamp, per_pool_decision, pool_metric
from autoscale.decision import ScaleDecision
from autoscale.perf_model_base import PerfModel
from autoscale.planner_base import Planner, register_planner
from autoscale.policy import SloPolicy
from autoscale.signals import Observation, Pool


class _PoolKpa:
    def __init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque()
        self.started = False
        self.panic_since: float | None = None
        self.max_panic = 0
        self.desired: deque[tuple[float, int]] = deque()  # for the scale-down delay


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
        tolerance: float = 0.1,
        scale_down_cooldown_s: float = 300.0,
    ) -> None:
        self.policy = policy
        self.targets = {Pool.DECODE: kv_target, Pool.PREFILL: prefill_waiting_target}
        self.stable_window_s = stable_window_s
        self.panic_window_s = panic_window_s
        self.panic_threshold = panic_threshold
        self.up_rate = max_scale_up_rate
        self.down_rate = max_scale_down_rate
        self.interval_s = tick_s
        self.tolerance = tolerance
        self.scale_down_cooldown_s = scale_down_cooldown_s
        self.state = {p: _PoolKpa() for p in POOLS}

    def _mean(self, st: _PoolKpa, now: float, window: float) -> float:
        vals = [v for t, v in st.samples if now - t <= window]
        return sum(vals) / len(vals) if vals else 0.0

    def _pool(self, obs: Observation, pool: Pool) -> tuple[int, str, dict[str, Any]]:
        st = self.state[pool]
        now = obs.now
        ready = obs.pool(pool).ready
        if not st.started:  # like Knative: start panicking above 1 pod, keep the scale
            st.started = True
            if ready > 1:
                st.panic_since, st.max_panic = now, ready
        st.samples.append((now, sum(pool_metric(obs, pool))))
        while st.samples and now - st.samples[0][0] > self.stable_window_s:
            st.samples.popleft()
        target = self.targets[pool]
        n = max(1, ready)
        lo, hi = math.floor(n / self.down_rate), math.ceil(self.up_rate * n)
        stable = self._mean(st, now, self.stable_window_s)
        panic = self._mean(st, now, self.panic_window_s)
        dspc = math.ceil(stable / target - 1e-9)
        dppc = math.ceil(panic / target - 1e-9)
        want_stable = min(hi, max(lo, dspc))
        want_panic = min(hi, max(lo, dppc))
        if dppc / n >= self.panic_threshold:
            st.panic_since = now
        elif st.panic_since is not None and now - st.panic_since > self.stable_window_s:
            st.panic_since, st.max_panic = None, 0
        if st.panic_since is not None:
            st.max_panic = max(st.max_panic, want_stable, want_panic)
            want, why = st.max_panic, "panic"
        else:
            want, why = want_stable, "stable"
            if want != ready > 0 and abs(stable / (n * target) - 1.0) <= self.tolerance:
                want, why = ready, "tolerance"
        if self.scale_down_cooldown_s > 0:
            st.desired.append((now, want))
            while st.desired and now - st.desired[0][0] > self.scale_down_cooldown_s:
                st.desired.popleft()
            held = max(d for _, d in st.desired)
            if held > want:
                want, why = held, "scale-down-cooldown"
        want, why = clamp(self.policy, pool, want, why)
        return want, why, {"stable": stable, "panic": panic, "dspc": dspc, "dppc": dppc}

    def plan(self, observation: Observation) -> ScaleDecision:
        return per_pool_decision(observation.now, lambda p: self._pool(observation, p))


register_planner(
    "aibrix-kpa", lambda policy, perf_model, **o: AibrixKpaPlanner(policy, perf_model, **o)
)
