"""Per-replica capacity at a latency target: from the timing model, a sweep, or online.

Every model answers the `PerfModel` questions from two per-replica curves, the prefill time of
one prompt alone `S(n)` and the decode step time `D(b, c)`, plus the replica's limits. The
rules that turn the curves into capacity (M/D/1 prefill at a TTFT percentile, the decode batch
at an ITL target) are `autoscale.perf_model_curve`'s `CurvePerfModel`; the online fit and its
prefill signals are `autoscale.perf_model_online`'s. This module holds the two fixed sources
and `build_perf_model`, and re-exports the others so callers import from one place.


Sources:
- `TimingPerfModel(timing)`: `S(n) = timing.prefill_time(n)`, `D(b, c) =
  timing.decode_time(b, b*c)` (`pools/sim/timing.py`'s roofline); limits from the timing model.
- `SweepPerfModel(sweep)`: the curves interpolated piecewise-linearly from a sweep file
  (`autoscale/perf_sweep.py`): `S` over ISL points (the last segment extended beyond the
  largest point, the smallest point's time held below it); `D` piecewise-linearly along the
  batch in every measured context column, then along the context, each extended linearly past
  its ends (the KV pool caps the batch at large contexts, so columns are ragged; at fixed
  context the roofline's memory-bound step is linear in the batch and at fixed batch linear
  in the context, so the extension is exact there).
- `OnlinePerfModel(prior)` (`autoscale.perf_model_online`): the prior's curves times a
  correction per pool, fitted from observed times.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from autoscale.perf_model_curve import (
    DEFAULT_PERCENTILE,
    DEFAULT_RHO_MAX,
    CurvePerfModel,
    max_utilisation,
    ttft_at_percentile,
)
from autoscale.perf_model_online import OnlinePerfModel, leg_correction, mean_response_s
from autoscale.perf_sweep import Sweep
from autoscale.policy import PerfModelSource, SloPolicy
from pools.sim.timing import TimingModel, make_timing

__all__ = [
    "DEFAULT_PERCENTILE",
    "DEFAULT_RHO_MAX",
    "CurvePerfModel",
    "OnlinePerfModel",
    "SweepPerfModel",
    "TimingPerfModel",
    "build_perf_model",
    "leg_correction",
    "max_utilisation",
    "mean_response_s",
    "ttft_at_percentile",
]


class TimingPerfModel(CurvePerfModel):
    """Curves from `pools/sim`'s roofline `TimingModel` (module docstring)."""

    def __init__(
        self,
        timing: TimingModel,
        *,
        block_size: int = 16,
        include_transfer: bool = True,
        percentile: float = DEFAULT_PERCENTILE,
        rho_max: float = DEFAULT_RHO_MAX,
        kv_usage_max: float = 1.0,
    ) -> None:
        super().__init__(
            kv_capacity_tokens=timing.kv_capacity_tokens,
            max_num_seqs=timing.max_num_seqs,
            block_size=block_size,
            percentile=percentile,
            rho_max=rho_max,
            kv_usage_max=kv_usage_max,
        )
        self.timing = timing
        self.include_transfer = include_transfer

    def transfer_s(self, uncached_tokens: int) -> float:
        return self.timing.kv_transfer_time(uncached_tokens) if self.include_transfer else 0.0

    def prefill_time_s(self, uncached_tokens: int) -> float:
        return self.timing.prefill_time(max(1, uncached_tokens))

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        b = max(1, batch)
        return self.timing.decode_time(b, b * max(0, context_tokens))


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys), xs ascending; the end segments extended linearly."""
    if len(xs) == 1:
        return ys[0]
    i = 1
    while i < len(xs) - 1 and x > xs[i]:
        i += 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class SweepPerfModel(CurvePerfModel):
    """Curves interpolated from a sweep file (module docstring)."""

    def __init__(
        self,
        sweep: Sweep,
        *,
        percentile: float = DEFAULT_PERCENTILE,
        rho_max: float = DEFAULT_RHO_MAX,
        kv_usage_max: float = 1.0,
    ) -> None:
        super().__init__(
            kv_capacity_tokens=sweep.kv_capacity_tokens,
            max_num_seqs=sweep.max_num_seqs,
            block_size=sweep.block_size,
            percentile=percentile,
            rho_max=rho_max,
            kv_usage_max=kv_usage_max,
        )
        self.sweep = sweep
        prefill = sorted(sweep.prefill.items())
        self._isl = [float(n) for n, _ in prefill]
        self._prefill_s = [t for _, t in prefill]
        self._contexts, self._batches, self._steps = sweep.decode_columns()

    @classmethod
    def load(cls, path: str | Path, **kwargs: float) -> SweepPerfModel:
        return cls(Sweep.load(path), **kwargs)

    def prefill_time_s(self, uncached_tokens: int) -> float:
        n = float(max(1, uncached_tokens))
        if n <= self._isl[0]:
            return self._prefill_s[0]
        return max(self._prefill_s[0], _interp(self._isl, self._prefill_s, n))

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        b, c = float(max(1, batch)), float(max(0, context_tokens))
        # along batch in every context column (extended linearly past the largest batch the
        # KV pool allowed at that context), then along context
        per_context = [
            _interp(bs, steps, b) for bs, steps in zip(self._batches, self._steps, strict=True)
        ]
        return max(1e-9, _interp(self._contexts, per_context, c))


def build_perf_model(policy: SloPolicy) -> CurvePerfModel:
    """The model `policy.perf_model` asks for, with the policy's TTFT percentile and rho_max:
    `timing-model` → `TimingPerfModel`; `sweep` → `SweepPerfModel`; `online` →
    `OnlinePerfModel` over the sweep when `sweep_file` is given, else over the timing model."""
    cfg = policy.perf_model
    percentile, rho_max = policy.slo.ttft_ms.percentile, cfg.rho_max
    prior: CurvePerfModel
    if cfg.sweep_file is not None and cfg.source is not PerfModelSource.TIMING_MODEL:
        prior = SweepPerfModel(Sweep.load(cfg.sweep_file), percentile=percentile, rho_max=rho_max)
    else:
        timing = make_timing(policy.model_profile, policy.gpu, tp=policy.tp)
        prior = TimingPerfModel(timing, percentile=percentile, rho_max=rho_max)
    if cfg.source is PerfModelSource.ONLINE:
        return OnlinePerfModel(
            prior,
            half_life_s=cfg.online_half_life_s,
            min_correction=cfg.online_min_correction,
            max_correction=cfg.online_max_correction,
            skip_decode_outliers=cfg.online_skip_decode_outliers,
            skip_decode_wait=cfg.online_skip_decode_wait,
            prefill_signal=cfg.online_prefill_signal,
        )
    return prior
