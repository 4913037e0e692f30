"""`dynamo-planner`: NVIDIA Dynamo's SLA planner, throughput mode as a floor + load mode.

Source: ai-dynamo/dynamo `components/src/dynamo/planner` (throughput and load modes, budget,
pending guard) and the legacy `planner_core.py` correction factors, as summarised in
PEER-AUTOSCALERS.md §1; our own implementation.

**Throughput mode**, every `throughput_interval_s` (180 s). The observations since the last
tick are aggregated into one window (request-weighted ISL/OSL/hit, mean TTFT/ITL) and fed to
the predictor (`forecaster`, default constant = last interval; Dynamo's default is ARIMA, the
Kalman of `autoscale/` plugs in here). With `ISL_u = ISL·(1-hit)`, `ctx = ISL + OSL/2`:
- `p_corr = TTFT_obs / perf.prefill_time_s(ISL_u)`;
  `N_p = ceil(rate·ISL_u·min(1, p_corr) / perf.prefill_tokens_per_s(ISL_u, TTFT_SLA))`.
- `d_corr = ITL_obs / perf.decode_step_s(conc, ctx)` with the per-replica concurrency
  `conc = rate·(TTFT_obs + OSL·ITL_obs) / N_d`;
  `N_d = ceil(rate·OSL / perf.decode_tokens_per_s(ctx, ITL_SLA / d_corr))`.
- then `max(·, min_endpoint)` (the pool's `min`), `max`, and if `N_p·g_p + N_d·g_d` exceeds
  `gpu_budget`, both shrink proportionally (`floor(N·budget/total)`, not below min).

**Load mode**, every `load_interval_s` (5 s), from the per-replica signals, with the perf model
standing in for Dynamo's online forward-pass regressions:
- prefill: each engine's estimated TTFT `perf.prefill_time_s(queued_i + ISL_u)`; **+1** if
  every engine's exceeds the SLA; **-1** if the queue-induced TTFT with the mean queue scaled by
  `N/(N-1)`, `perf.prefill_time_s(q̄·N/(N-1))`, stays under `(SLA - T_own)·sensitivity`.
- decode: each engine's estimated ITL `perf.decode_step_s(running_i, ctx_i)`; **+1** if every
  engine's exceeds the SLA; **-1** if the mean KV tokens `·N/(N-1)` stay under the engine's KV
  capacity and `perf.decode_step_s(b̄·N/(N-1), ctx) < SLA·sensitivity`.
- `desired = max(throughput floor, current ± 1)`; `sensitivity` = 0.8
  (`load_scaling_down_sensitivity` 80).

**Pending guard**: while any pool has pending replicas (a change is in progress), the planner
skips the tick and repeats its last desired counts.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from autoscale.baselines.common import POOLS, clamp
from autoscale.decision import ScaleDecision
from autoscale.forecast_seam import EwmaForecaster, Forecaster, LoadForecast
from autoscale.perf_model_base import PerfModel
from autoscale.planner_base import Planner, register_planner
from autoscale.policy import SloPolicy
from autoscale.signals import LatencySummary, Observation, Pool
from autoscale.sizing import context_tokens, itl_target_s, ttft_target_s, uncached_tokens


class _Window:
    """Request-weighted aggregate of the observations of one throughput interval."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.requests = 0.0
        self.isl = self.osl = self.hit_tokens = 0.0
        self.ttft_sum = self.ttft_n = self.itl_sum = self.itl_n = 0.0

    def add(self, o: Observation) -> None:
        n = o.num_requests or o.arrival_rps * o.window_s
        self.seconds += o.window_s
        self.requests += n
        self.isl += n * o.mean_isl_tokens
        self.osl += n * o.mean_osl_tokens
        self.hit_tokens += n * o.mean_isl_tokens * o.prefix_hit_rate
        if o.ttft.mean_s is not None and o.ttft.count:
            self.ttft_sum += o.ttft.mean_s * o.ttft.count
            self.ttft_n += o.ttft.count
        if o.itl.mean_s is not None and o.itl.count:
            self.itl_sum += o.itl.mean_s * o.itl.count
            self.itl_n += o.itl.count

    def observation(self, last: Observation) -> Observation:
        n = self.requests
        return replace(
            last,
            window_s=max(self.seconds, 1e-9),
            num_requests=round(n),
            arrival_rps=n / self.seconds if self.seconds > 0 else 0.0,
            mean_isl_tokens=self.isl / n if n else 0.0,
            mean_osl_tokens=self.osl / n if n else 0.0,
            prefix_hit_rate=self.hit_tokens / self.isl if self.isl else 0.0,
            ttft=LatencySummary(
                count=int(self.ttft_n), mean_s=self.ttft_sum / self.ttft_n if self.ttft_n else None
            ),
            itl=LatencySummary(
                count=int(self.itl_n), mean_s=self.itl_sum / self.itl_n if self.itl_n else None
            ),
        )


class DynamoPlanner(Planner):
    name = "dynamo-planner"

    def __init__(
        self,
        policy: SloPolicy,
        perf_model: PerfModel,
        *,
        forecaster: Forecaster | None = None,
        throughput_interval_s: float = 180.0,
        load_interval_s: float = 5.0,
        sensitivity: float = 0.8,
        throughput_mode: bool = True,
        load_mode: bool = True,
    ) -> None:
        self.policy = policy
        self.perf = perf_model
        self.forecaster: Forecaster = forecaster or EwmaForecaster(alpha=1.0)
        self.throughput_interval_s = throughput_interval_s
        self.interval_s = load_interval_s
        self.sensitivity = sensitivity
        self.throughput_mode = throughput_mode
        self.load_mode = load_mode
        self._window = _Window()
        self._floor: dict[Pool, int] = {p: policy.limits(p).min for p in POOLS}
        self._floor_inputs: dict[str, Any] = {}
        self._floor_at: float | None = None
        self._last: dict[Pool, int] | None = None

    # -- throughput mode ---------------------------------------------------------------------
    def _throughput(self, obs: Observation) -> None:
        agg = self._window.observation(obs)
        self._window = _Window()
        self.forecaster.observe(agg)
        rate, isl, osl, hit = LoadForecast(*self.forecaster.forecast(self.throughput_interval_s))
        ttft_sla, itl_sla = ttft_target_s(self.policy), itl_target_s(self.policy)
        isl_u = uncached_tokens(isl, hit)
        ctx = context_tokens(isl, osl)
        p_corr = 1.0
        if agg.ttft.mean_s:
            p_corr = agg.ttft.mean_s / self.perf.prefill_time_s(isl_u)
        d_corr = 1.0
        n_d_ready = max(1, obs.pool(Pool.DECODE).ready)
        if agg.itl.mean_s and agg.arrival_rps > 0:
            dur = (agg.ttft.mean_s or 0.0) + agg.mean_osl_tokens * agg.itl.mean_s
            conc = max(1, round(agg.arrival_rps * dur / n_d_ready))
            d_corr = agg.itl.mean_s / self.perf.decode_step_s(conc, ctx)
        cap_p = self.perf.prefill_tokens_per_s(isl_u, ttft_sla)
        cap_d = self.perf.decode_tokens_per_s(ctx, itl_sla / d_corr) if d_corr > 0 else 0.0
        load_p = rate * isl * (1.0 - hit) * min(1.0, p_corr)
        n_p = (
            math.ceil(load_p / cap_p - 1e-9) if cap_p > 0 else self.policy.limits(Pool.PREFILL).max
        )
        n_d = (
            math.ceil(rate * osl / cap_d - 1e-9)
            if cap_d > 0
            else self.policy.limits(Pool.DECODE).max
        )
        counts = {Pool.PREFILL: n_p, Pool.DECODE: n_d}
        for p in POOLS:
            counts[p] = clamp(self.policy, p, counts[p], "")[0]
        self._floor = self._budget(counts)
        self._floor_inputs = {
            "forecast": [rate, isl, osl, hit],
            "p_corr": p_corr,
            "d_corr": d_corr,
            "raw": {str(p): n for p, n in counts.items()},
        }

    def _budget(self, counts: dict[Pool, int]) -> dict[Pool, int]:
        budget = self.policy.gpu_budget
        gpus = {p: self.policy.limits(p).gpus_per_replica for p in POOLS}
        total = sum(counts[p] * gpus[p] for p in POOLS)
        if budget is None or total <= budget:
            return counts
        scale = budget / total
        return {p: max(self.policy.limits(p).min, math.floor(counts[p] * scale)) for p in POOLS}

    # -- load mode -------------------------------------------------------------------------
    def _load_step(self, obs: Observation, pool: Pool) -> int:
        reps = obs.replicas_of(pool)
        n = len(reps)
        if n == 0:
            return 0
        sens = self.sensitivity
        if pool is Pool.PREFILL:
            sla = ttft_target_s(self.policy)
            isl_u = uncached_tokens(obs.mean_isl_tokens, obs.prefix_hit_rate)
            est = [self.perf.prefill_time_s(r.queued_prefill_tokens + isl_u) for r in reps]
            if all(e > sla for e in est):
                return 1
            if n > 1:
                q = sum(r.queued_prefill_tokens for r in reps) / n * n / (n - 1)
                t_own = self.perf.prefill_time_s(isl_u)
                if self.perf.prefill_time_s(round(q)) < (sla - t_own) * sens:
                    return -1
            return 0
        sla = itl_target_s(self.policy)
        default_ctx = context_tokens(obs.mean_isl_tokens, obs.mean_osl_tokens)

        def ctx_of(kv: int, running: int) -> int:
            return max(1, round(kv / running)) if running and kv else default_ctx

        est = [
            self.perf.decode_step_s(r.num_running, ctx_of(r.decode_kv_tokens, r.num_running))
            for r in reps
        ]
        if all(e > sla for e in est):
            return 1
        if n > 1:
            grow = n / (n - 1)
            kv = sum(r.decode_kv_tokens for r in reps) / n * grow
            cap = min((r.kv_capacity_tokens for r in reps), default=0)
            running = sum(r.num_running for r in reps)
            batch = running / n * grow
            ctx = ctx_of(sum(r.decode_kv_tokens for r in reps), running)
            kv_ok = cap <= 0 or kv < cap
            if kv_ok and self.perf.decode_step_s(math.ceil(batch), ctx) < sla * sens:
                return -1
        return 0

    # -- plan --------------------------------------------------------------------------------
    def plan(self, observation: Observation) -> ScaleDecision:
        obs = observation
        self._window.add(obs)
        if any(obs.pool(p).pending > 0 for p in POOLS):
            held = self._last or {p: obs.pool(p).provisioned for p in POOLS}
            return ScaleDecision(obs.now, dict(held), {p: "pending-guard" for p in POOLS})
        if self.throughput_mode and (
            self._floor_at is None or obs.now - self._floor_at >= self.throughput_interval_s
        ):
            self._throughput(obs)
            self._floor_at = obs.now
        desired: dict[Pool, int] = {}
        reasons: dict[Pool, str] = {}
        steps: dict[str, int] = {}
        for p in POOLS:
            current = obs.pool(p).provisioned
            step = self._load_step(obs, p) if self.load_mode else 0
            steps[str(p)] = step
            load_n = current + step if self.load_mode else self._floor[p]
            floor = self._floor[p] if self.throughput_mode else 0
            n, why = (floor, "throughput") if floor >= load_n else (load_n, f"load{step:+d}")
            desired[p], reasons[p] = clamp(self.policy, p, n, why)
        shrunk = self._budget(desired)
        for p in POOLS:
            if shrunk[p] < desired[p]:
                desired[p], reasons[p] = shrunk[p], "budget"
        self._last = desired
        details = {
            "floor": {str(p): n for p, n in self._floor.items()},
            "load_steps": steps,
            "throughput": self._floor_inputs,
        }
        return ScaleDecision(obs.now, desired, reasons, (), details)


register_planner(
    "dynamo-planner", lambda policy, perf_model, **o: DynamoPlanner(policy, perf_model, **o)
)
