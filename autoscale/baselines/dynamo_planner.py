"""`dynamo-planner`: NVIDIA Dynamo's SLA planner, throughput mode as a floor + load mode.

Source: ai-dynamo/dynamo `components/src/dynamo/planner/core` (`throughput_scaling.py`,
`load_scaling.py`, budget, pending guard) and, as an option, the legacy `planner_core.py`
correction factors (PEER-AUTOSCALERS.md §1); our own implementation, with the perf model
standing in for Dynamo's profiled interpolators and online forward-pass regressions.

**Throughput mode**, every `throughput_interval_s` (180 s). The observations since the last
tick are aggregated into one window (request-weighted ISL/OSL/hit, mean TTFT/ITL) and fed to
the predictor (`forecaster`; through the registry the policy's `predictor`, constructed
directly constant = last interval; Dynamo defaults to ARIMA and offers Kalman too).
With `ISL_u = ISL·(1-hit)`, `ctx = ISL + OSL/2`:
- `N_p = max(ceil(rate / engine_rps_P), sla_floor, min)`, `engine_rps_P =
  perf.prefill_tokens_per_s(ISL_u, TTFT_SLA) / ISL_u`; `sla_floor = ceil(t_own / TTFT_SLA)`
  when a lone prefill already misses the SLA (else 1).
- `N_d = max(ceil(rate / engine_rps_D), min)`, `engine_rps_D =
  perf.decode_tokens_per_s(ctx, ITL_SLA) / OSL`.
- `legacy_corrections=True` (off by default): the legacy planner's
  `p_corr = TTFT_obs / t_own` scales the prefill load by `min(1, p_corr)` and
  `d_corr = ITL_obs / perf.decode_step_s(conc, ctx)` (`conc = rate·(TTFT_obs + OSL·ITL_obs)
  / N_d`) tightens the decode target to `ITL_SLA / d_corr`.
- With load mode on, the result is a floor for it.

**Load mode**, every `load_interval_s` (5 s), per engine (ready replica), `N` engines,
`g = N/(N-1)`, `sensitivity` 0.8 (`load_scaling_down_sensitivity` 80):
- prefill: estimated TTFT `perf.prefill_time_s(queued_i + ISL_u)`. **+1** if every engine's
  exceeds the SLA. **-1** if `SLA - T_own > 0` and, for every engine, the queue-induced part
  `perf.prefill_time_s(queued_i·g + ISL_u) - T_own < (SLA - T_own)·sensitivity`.
- decode: estimated ITL `perf.decode_step_s(running_i, ctx_i)`. **+1** if every engine's
  exceeds the SLA. **-1** if, for every engine, `decode_kv_tokens_i·g < kv_capacity_tokens_i`
  and `perf.decode_step_s(ceil(running_i·g), ctx_i) < SLA·sensitivity`.
- `desired = max(throughput floor, N ± 1, min)`, then the budget.

**Budget**: when `N_p·g_p + N_d·g_d > gpu_budget`, both shrink proportionally
(`floor(N·budget/total)`, not below min). **Pending guard**: while any pool has pending
replicas (a change is in progress) the tick is skipped and the last desired counts repeat.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from autoscale.baselines.common import POOLS, clamp
from autoscale.decision import ScaleDecision
from autoscale.forecast_seam import EwmaForecaster, Forecaster, LoadForecast, PredictorForecaster
from autoscale.perf_model_base import PerfModel
from autoscale.planner_base import Planner, register_planner
from autoscale.policy import SloPolicy
from autoscale.signals import LatencySummary, Observation, Pool, ReplicaSignals
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
        legacy_corrections: bool = False,
    ) -> None:
        self.policy = policy
        self.perf = perf_model
        self.forecaster: Forecaster = forecaster or EwmaForecaster(alpha=1.0)
        self.throughput_interval_s = throughput_interval_s
        self.interval_s = load_interval_s
        self.sensitivity = sensitivity
        self.throughput_mode = throughput_mode
        self.load_mode = load_mode
        self.legacy_corrections = legacy_corrections
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
        t_own = self.perf.prefill_time_s(isl_u)
        p_corr = d_corr = 1.0
        if self.legacy_corrections:
            if agg.ttft.mean_s and t_own > 0:
                p_corr = min(1.0, agg.ttft.mean_s / t_own)
            n_d_ready = max(1, obs.pool(Pool.DECODE).ready)
            if agg.itl.mean_s and agg.arrival_rps > 0:
                dur = (agg.ttft.mean_s or 0.0) + agg.mean_osl_tokens * agg.itl.mean_s
                conc = max(1, round(agg.arrival_rps * dur / n_d_ready))
                d_corr = agg.itl.mean_s / self.perf.decode_step_s(conc, ctx)
        rps_p = self.perf.prefill_tokens_per_s(isl_u, ttft_sla) / isl_u
        rps_d = self.perf.decode_tokens_per_s(ctx, itl_sla / d_corr) / osl if osl > 0 else 0.0
        big = {p: self.policy.limits(p).max for p in POOLS}
        sla_floor = math.ceil(t_own / ttft_sla) if t_own > ttft_sla else 1
        demand_p = rate * p_corr
        n_p = math.ceil(demand_p / rps_p - 1e-9) if rps_p > 0 else big[Pool.PREFILL]
        n_p = max(n_p, sla_floor)
        n_d = math.ceil(rate / rps_d - 1e-9) if rps_d > 0 else big[Pool.DECODE]
        if rate <= 0:
            n_p, n_d = sla_floor if isl > 0 else 0, 0
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
        grow = n / (n - 1) if n > 1 else 1.0
        if pool is Pool.PREFILL:
            sla = ttft_target_s(self.policy)
            isl_u = uncached_tokens(obs.mean_isl_tokens, obs.prefix_hit_rate)
            t_own = self.perf.prefill_time_s(isl_u)
            est = [self.perf.prefill_time_s(r.queued_prefill_tokens + isl_u) for r in reps]
            if all(e > sla for e in est):
                return 1
            budget = (sla - t_own) * sens
            if n > 1 and sla - t_own > 0:
                after = [
                    self.perf.prefill_time_s(int(r.queued_prefill_tokens * grow) + isl_u) - t_own
                    for r in reps
                ]
                if all(a < budget for a in after):
                    return -1
            return 0
        sla = itl_target_s(self.policy)
        default_ctx = context_tokens(obs.mean_isl_tokens, obs.mean_osl_tokens)

        def ctx_of(r: ReplicaSignals) -> int:
            if r.num_running and r.decode_kv_tokens:
                return max(1, round(r.decode_kv_tokens / r.num_running))
            return default_ctx

        est = [self.perf.decode_step_s(r.num_running, ctx_of(r)) for r in reps]
        if all(e > sla for e in est):
            return 1
        if n > 1:
            for r in reps:
                cap = r.kv_capacity_tokens
                if cap > 0 and r.decode_kv_tokens * grow >= cap:
                    return 0
                post = self.perf.decode_step_s(math.ceil(r.num_running * grow - 1e-9), ctx_of(r))
                if post >= sla * sens:
                    return 0
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


def _make_dynamo(policy: SloPolicy, perf_model: PerfModel, **options: Any) -> DynamoPlanner:
    """The registry's factory: the policy's predictor is the default forecaster (Dynamo lets
    the user pick one too: constant/ARIMA/Kalman/Prophet); `forecaster=` overrides it."""
    options.setdefault("forecaster", PredictorForecaster(policy.predictor, policy.predictor_params))
    return DynamoPlanner(policy, perf_model, **options)


register_planner("dynamo-planner", _make_dynamo)
