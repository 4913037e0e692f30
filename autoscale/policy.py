"""The SLO policy: what the autoscaler must keep, with what, and how fast it may move.

Loaded from YAML (`load_policy`); every error names the field (dotted path) and, when read
from a file, its line. Defaults work for Llama-3.1-8B on H100 without tuning. The complete,
commented example is `deploy/examples/slo-policy.yaml`; `autoscale/README.md` documents each
field.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autoscale.signals import Pool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LatencyTarget(_Strict):
    """`percentile` of the latency must stay ≤ `target` (milliseconds)."""

    percentile: float = Field(default=99.0, gt=0, lt=100)
    target: float = Field(gt=0)


class SloTargets(_Strict):
    """TTFT sizes the prefill pool, ITL the decode pool; `attainment` is the share of requests
    that must meet both."""

    ttft_ms: LatencyTarget = Field(default_factory=lambda: LatencyTarget(target=2000.0))
    itl_ms: LatencyTarget = Field(default_factory=lambda: LatencyTarget(target=50.0))
    attainment: float = Field(default=0.99, gt=0, le=1)


class PoolLimits(_Strict):
    """One pool's bounds and the physical facts of its replicas."""

    min: int = Field(default=1, ge=0)
    max: int = Field(default=16, ge=1)
    gpus_per_replica: int = Field(default=1, ge=1)
    startup_s: float = Field(default=120.0, ge=0)  # cold start until the replica is ready
    drain_timeout_s: float = Field(default=300.0, gt=0)  # in-flight work may finish this long

    @model_validator(mode="after")
    def _bounds(self) -> PoolLimits:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class Intervals(_Strict):
    """How often the planner runs: `predictive_s` for the forecast floor, `reactive_s` for the
    fast steps above it."""

    predictive_s: float = Field(default=60.0, gt=0)
    reactive_s: float = Field(default=5.0, gt=0)


class Stabilization(_Strict):
    """A scale-down must be recommended for `scale_down_s` before it happens; a scale-up may
    happen after `scale_up_s` (0: at once)."""

    scale_up_s: float = Field(default=0.0, ge=0)
    scale_down_s: float = Field(default=180.0, ge=0)


class PredictorKind(StrEnum):
    CONSTANT = "constant"
    EWMA = "ewma"
    HOLT = "holt"
    KALMAN = "kalman"


class PerfModelSource(StrEnum):
    TIMING_MODEL = "timing-model"  # pools/sim's roofline for `model` on `gpu`
    SWEEP = "sweep"  # a file written by `pdorch profile --sweep`
    ONLINE = "online"  # the timing model as a prior, corrected from observed step times


class PerfModelConfig(_Strict):
    source: PerfModelSource = PerfModelSource.ONLINE
    sweep_file: str | None = None

    @model_validator(mode="after")
    def _sweep_needs_file(self) -> PerfModelConfig:
        if self.source is PerfModelSource.SWEEP and not self.sweep_file:
            raise ValueError("source 'sweep' needs sweep_file")
        return self


class SloPolicy(_Strict):
    """The whole policy (see module docstring)."""

    model_profile: str = "llama-3.1-8b"  # a `pdorch profile` model profile name
    gpu: str = "h100"
    tp: int = Field(default=1, ge=1)
    slo: SloTargets = Field(default_factory=SloTargets)
    pools: dict[Pool, PoolLimits] = Field(
        default_factory=lambda: {Pool.PREFILL: PoolLimits(), Pool.DECODE: PoolLimits()}
    )
    gpu_budget: int | None = Field(default=None, ge=1)  # GPUs shared by both pools
    intervals: Intervals = Field(default_factory=Intervals)
    stabilization: Stabilization = Field(default_factory=Stabilization)
    predictor: PredictorKind = PredictorKind.HOLT
    perf_model: PerfModelConfig = Field(default_factory=PerfModelConfig)
    role_switching: bool = False  # replicas are `kv_both`: move them between pools
    switch_s: float = Field(default=5.0, ge=0)  # drain + relabel time of one role move

    def limits(self, pool: Pool) -> PoolLimits:
        return self.pools.get(pool, PoolLimits())
