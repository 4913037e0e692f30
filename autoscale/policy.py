"""The SLO policy: what the autoscaler must keep, with what, and how fast it may move.

Loaded from YAML (`load_policy`); every error names the field (dotted path) and, when read
from a file, its line. Defaults work for Llama-3.1-8B on H100 without tuning. The complete,
commented example is `deploy/examples/slo-policy.yaml`; `autoscale/README.md` documents each
field.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from autoscale.reversal_budget import ReversalBudgetOptions
from autoscale.signals import Pool
from autoscale.spare import LearntSpareOptions, SpareMode
from pools.yaml_errors import (
    ConfigFileError,
    FieldPathError,
    read_yaml,
    validate_config,
)

# Ceilings past which a target is a unit mistake (seconds written as ms, ms as µs), not a SLO.
MAX_TTFT_TARGET_MS = 600_000.0  # 10 min
MAX_ITL_TARGET_MS = 10_000.0  # 10 s per token
# planner.cold_start_spare's default: 1.5 decode replicas on the floor ahead and in the start
# fleet (since Round 15, with `cold_start_spare_mode: learnt`, the learnt spare's prior for the
# first `prior_s` and the start fleet's spare). With the burst decode model the start fleet is
# otherwise 1 decode replica, and the
# Azure trace's opening ramp (18 -> 78 rps in 50 s) queued first tokens for a whole cold start
# (Round 13 decode: Azure x14 prefix 78.28 % without it, 97.08 % with it; Round 14: the whole
# Azure hour 99.64 % at 0.89x main's GPU-hours).
DEFAULT_DECODE_COLD_START_SPARE = 1.5
DEFAULT_COLD_START_SPARE: Mapping[Pool, float] = MappingProxyType(
    {Pool.DECODE: DEFAULT_DECODE_COLD_START_SPARE}
)


class PolicyError(ConfigFileError):
    """The SLO policy is invalid: every issue names the dotted field path and, read from YAML,
    its line (`slo-policy.yaml:12: pools.prefill.min: ...`)."""

    default_source = "slo policy"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LatencyTarget(_Strict):
    """`percentile` of the latency must stay ≤ `target` (milliseconds).

    `percentile` is in [50, 100): the observation window reports p50/p90/p99 and a planner
    reads the nearest one at or below it (`LatencySummary.percentile`), so a tail below the
    median is not a SLO."""

    percentile: float = Field(default=99.0, ge=50, lt=100)
    target: float = Field(gt=0)


class SloTargets(_Strict):
    """TTFT sizes the prefill pool, ITL the decode pool; `attainment` is the share of requests
    that must meet both."""

    ttft_ms: LatencyTarget = Field(default_factory=lambda: LatencyTarget(target=2000.0))
    itl_ms: LatencyTarget = Field(default_factory=lambda: LatencyTarget(target=50.0))
    attainment: float = Field(default=0.99, gt=0, le=1)

    @model_validator(mode="after")
    def _sane_targets(self) -> SloTargets:
        if self.ttft_ms.target > MAX_TTFT_TARGET_MS:
            raise FieldPathError(
                ("ttft_ms", "target"),
                f"{self.ttft_ms.target:g} ms is above {MAX_TTFT_TARGET_MS:g} ms: the unit is "
                "milliseconds",
            )
        if self.itl_ms.target > MAX_ITL_TARGET_MS:
            raise FieldPathError(
                ("itl_ms", "target"),
                f"{self.itl_ms.target:g} ms is above {MAX_ITL_TARGET_MS:g} ms: the unit is "
                "milliseconds",
            )
        return self


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
            raise FieldPathError(("min",), f"min ({self.min}) is above max ({self.max})")
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


class PrefillSignal(StrEnum):
    """What the online fit learns the prefill service time from (`OnlinePerfModel`)."""

    TTFT = "ttft"  # the window's median end-to-end TTFT against prefill + transfer
    PREFILL_LEG = "prefill-leg"  # the prefill leg's own mean duration against the model's leg


class PredictorParams(_Strict):
    """Parameters of every predictor; only the chosen one's are read (`autoscale/predictors.py`).

    EWMA `s <- alpha*x + (1-alpha)*s`; Holt level/trend smoothing `alpha`/`beta`; Kalman local
    linear trend with process noise `q_level`/`q_trend`, measurement noise `r`, and `min_points`
    observations before it forecasts (before that: the last value). Kalman defaults are
    Dynamo's (1.0 / 0.1 / 10 / 5)."""

    ewma_alpha: float = Field(default=0.3, gt=0, le=1)
    holt_alpha: float = Field(default=0.5, gt=0, le=1)
    holt_beta: float = Field(default=0.3, gt=0, le=1)
    kalman_q_level: float = Field(default=1.0, ge=0)
    kalman_q_trend: float = Field(default=0.1, ge=0)
    kalman_r: float = Field(default=10.0, gt=0)
    kalman_min_points: int = Field(default=5, ge=1)


class PerfModelConfig(_Strict):
    """Where per-replica capacity comes from (`autoscale/perf_model.py`).

    `sweep_file` (relative to the policy file) is required for `sweep` and, given with
    `online`, replaces the timing model as the prior. `online_half_life_s` is the age at which
    an observation of the online correction weighs half; the correction stays within
    [`online_min_correction`, `online_max_correction`] of the prior; with
    `online_skip_decode_outliers` a decode replica-window past `online_max_correction` x the
    prior's step is not learnt, with `online_skip_decode_wait` (on by default since Round 14)
    no prefill TTFT of a window that ended with sequences waiting for a decode slot (their TTFT
    holds that wait; Round 10)
    (`OnlinePerfModel`). `online_prefill_signal` is what the prefill correction is learnt from:
    `ttft` (the window's median TTFT against prefill + transfer) or `prefill-leg` (the prefill
    leg's mean duration against the model's queue wait + prefill at the observed load; the
    planner's own prefill correction reads the leg too; Round 11). `ttft` is the default: the
    leg with `planner.ramp_epsilon` 0.1 won on the short workloads (Round 13) but flapped
    prefill on the whole Azure hour, 3 in its worst 10 minutes, at 1.03x the GPU-hours
    (`benchmarks/results/autoscale-round13-whole/`).
    `rho_max` caps a prefill replica's utilisation whatever the queueing bound allows
    (headroom for bursts). With
    `decode_residence_at_batch_step` the decode sizing counts a sequence's residence at the
    step time of the batch it packs, not at the ITL target (`autoscale/sizing.py`; off by
    default: Round 8 measured it on the short day only). With `decode_burst_queue` (on by
    default since Round 14: the whole Azure hour x14 at 0.89x main's GPU-hours and the 2-hour
    day, `benchmarks/results/autoscale-round14-default/`) it also sizes for the queue a burst
    builds in front of the packed batch: the `slo.ttft_ms` percentile of the sequences in
    flight, `m + z·sqrt(I·m)` with `I` = `decode_burst_dispersion` (`autoscale/sizing.py`;
    the oracle counts the trace's own), and for the KV those sequences hold. With
    `decode_burst_dispersion_online` pdorch's decode floor learns `I` from the arrivals per
    planner window, `decode_burst_dispersion` its prior for the first minute
    (`autoscale/dispersion.py`; Round 12; on by default since Round 14)."""

    source: PerfModelSource = PerfModelSource.ONLINE
    sweep_file: str | None = None
    online_half_life_s: float = Field(default=300.0, gt=0)
    online_min_correction: float = Field(default=0.25, gt=0)
    online_max_correction: float = Field(default=4.0, gt=0)
    online_skip_decode_outliers: StrictBool = False
    online_skip_decode_wait: StrictBool = True
    online_prefill_signal: PrefillSignal = PrefillSignal.TTFT
    decode_residence_at_batch_step: StrictBool = False
    rho_max: float = Field(default=0.9, gt=0, lt=1)
    decode_burst_queue: StrictBool = True
    decode_burst_dispersion: float = Field(default=16.0, ge=1, le=1000)
    decode_burst_dispersion_online: StrictBool = True

    @field_validator("sweep_file")
    @classmethod
    def _relative_to_policy(cls, value: str | None, info: ValidationInfo) -> str | None:
        base = (info.context or {}).get("base_dir")
        if value is None or base is None or Path(value).is_absolute():
            return value
        return str((Path(base) / value).resolve())

    @model_validator(mode="after")
    def _sweep_needs_file(self) -> PerfModelConfig:
        if self.source is PerfModelSource.SWEEP and not self.sweep_file:
            raise FieldPathError(("sweep_file",), "source 'sweep' needs sweep_file")
        if self.sweep_file is not None and not Path(self.sweep_file).is_file():
            raise FieldPathError(
                ("sweep_file",),
                f"no such file: {self.sweep_file} (write it with `pdorch "
                "profile --sweep --out FILE`)",
            )
        if self.online_min_correction > self.online_max_correction:
            raise FieldPathError(
                ("online_min_correction",), "online_min_correction is above online_max_correction"
            )
        return self


class PlannerOptions(_Strict):
    """pdorch's planner options (`autoscale/planner.py`'s module docstring has each rule; the
    peers' baselines ignore this section). Defaults are the planner's own: a file without
    `planner:` plans exactly as before. `None` means derived: `level_window_s` and
    `forecast_window_s` 0 (each window as it is), `floor_hold_s` the `scale_down_s` window,
    `ahead_hold_s` the `floor_hold_s`.

    - `headroom` (0.9): share of a replica's capacity at the target the floor plans to use.
    - `margin` (0.8): headroom the scale-down fit check keeps.
    - `kv_high` (0.9): KV usage per decode replica the `kv-usage` term keeps below.
    - `min_samples` (20): requests a window needs before its percentiles are read.
    - `correction_alpha` (0.2): EWMA weight of a new observed/predicted latency ratio.
    - `stand_in` (true): a role move may stand in for a cold start the taker is about to order.
    - `forecast_window_s`: seconds of windows aggregated per forecaster point.
    - `trend_cap` (1.5): the rate projected `startup_s` ahead is at most this x its level.
    - `trend_hold_s` (30): the projected growth is the mean over this many seconds of ticks.
    - `fast_down_s` (60): a count every tick of this long found fitting scales down early.
    - `level_window_s`: the load is read as its sliding mean over this long.
    - `floor_hold_s`, `ahead_hold_s`: how long a floor for the load now / `startup_s` ahead
      bounds the fast way down.
    - `decode_fit_as_floor` (false): the decode fit check is the floor's own model.
    - `trend_age` (false): project the growth only over the part of `startup_s` it has lasted.
    - `release_after_ticks` (0, off): release a projection the level stays below for k ticks.
    - `decode_residence_mean` (false): the decode floor's need is its mean over the last
      residence time `T_own + OSL·ITL` (`autoscale/residence.py`).
    - `decode_correction_on_target` (false): the decode correction moves the ITL target the
      batch is read at; the KV pool and `max_num_seqs` cap it (`autoscale/sizing.py`).
    - `hysteresis` (0.1): within `hysteresis_window_s` (600) after a pool moved, its reversal
      reads the floor's need widened by this fraction (`autoscale/stabilization.py`).
    - `budget_margin` (0.2): while `gpu_budget` binds, the last split stands unless a fresh
      one raises the estimated attainment by more than this (`autoscale/budget.py`).
    - `reversal_ticks` (6; 1: off): within `hysteresis_window_s` after a pool went
      down, an up the predictive floor alone orders (not the reactive terms) happens only
      once its up count has been above the current count this many ticks in a row.
    - `decode_wait_attribution` (true since Round 14; false before): a TTFT breach while sequences
      wait for a decode slot grows decode, not prefill, when prefill's own queue would serve in
      time; no prefill correction from such a window (`autoscale/planner_terms.py`, Round 10).
    - `cold_start_growth` (null: off; per pool, in [1, 10]): the floor for the load `startup_s`
      ahead is sized for at least this x the level, the growth the pool must absorb while a
      replica ordered now starts (`autoscale/predictive_floor.py`, Round 10).
    - `cold_start_spare` ({decode: 1.5} since Round 14; null: off; per pool, replicas in [0, 16]):
      the floor for the load `startup_s` ahead needs at least the floor for the load now plus this
      many replicas (an additive spare, where `cold_start_growth` multiplies the rate), and pdorch's
      start fleet holds it (`autoscale/predictive_floor.py`, Round 13).
    - `cold_start_spare_until_s` (null: the spare stands the whole run; seconds >= 0): the
      spare applies to ticks before this time only (the opening ramps it was measured on);
      after it the floor ahead is the plain one (`autoscale/predictive_floor.py`, Round 14).
    - `cold_start_spare_mode` (`learnt` since Round 15's whole runs; `fixed`: `cold_start_spare`
      stands as given; `learnt`: each pool
      it names gets the growth of its floor's need within one `startup_s`, the
      `cold_start_spare_learnt.quantile` of the last `window_s`, at most `cap`, the given
      replicas its prior for the first `prior_s`; `autoscale/spare.py`, Round 15).
    - `cold_start_spare_learnt` (`window_s` 1200, `quantile` 0.95, `cap` 3.0 replicas,
      `prior_s` 300, `smooth_s` 0): the learnt spare's parameters (read in `learnt` mode only).
    - `move_stabilization` (false; only with `role_switching`): a role move is a direction
      change of both pools, held to their reversal rules: the giver gives only what its
      floor's need widened by `hysteresis` and its own way down (the largest raw count of
      the last `scale_down_s`) leave, the move is recorded as the giver's down and the
      taker's up (so hysteresis and `reversal_ticks` hold their reversals), and a borrow
      into a pool within `hysteresis_window_s` after that pool gave one back is refused
      unless the pool breaches now (`autoscale/role_moves.py`, Round 11).
    - `budget_keep_fleet` (true; false: a fresh split the tick the budget starts binding): the
      tick `gpu_budget` starts binding, the fleet as provisioned (ready + pending) is kept as
      the split while it is valid and a fresh split gains at most `budget_margin`
      (`autoscale/cross_pool.py`, Round 12).
    - `move_release_check` (false; only with `role_switching`): move stabilization's giver
      check alone: a lender gives, and a borrower returns, only what its own way down would
      release (its floor's need widened by `hysteresis`, the largest raw count of the last
      `scale_down_s`); no refusal of re-borrows, no move recorded in the stabilizers
      (`autoscale/role_moves.py`, Round 13).
    - `ramp_epsilon` (0: off, the default; in [0, 1) replicas; 0.1 with the leg fit flapped
      the whole Azure hour, Round 13): while the floor for the load `startup_s` ahead is
      sized for a rate above the level, replica k is ordered
      once its need passes `k - ramp_epsilon`, not k: `ceil(need + ε)`
      (`autoscale/ramp_edge.py`, Round 13).
    - `prefill_floor_hold_s` (null: off; seconds; 60 won on the short workloads but flapped
      prefill on the whole Azure hour, 4 direction changes in its worst 10 minutes, Round 13):
      once the level has fallen 25 % from its peak of the last `floor_hold_s`, the prefill
      pool's fast way down holds its floors for the load now and ahead this long only
      (`autoscale/prefill_release.py`, Round 13).
    - `budget_now_first` (true since Round 14; false before): while `gpu_budget` binds, each pool's
      need for the load now (its floor for the level, its reactive term) is split first and the
      headroom for the load ahead gets what is left (`autoscale/budget.py`, Round 13).
    - `prefill_scale_down_s` (90 since Round 16; null: `stabilization.scale_down_s`; seconds
      >= 0, never longer than `stabilization.scale_down_s`): the prefill pool's own
      scale-down window; its fast way down holds its floors at most this long
      (`autoscale/prefill_down.py`, Rounds 15-16).
    - `prefill_fall_release` (false): while the forecast's mean growth `startup_s` ahead over
      the last `trend_hold_s` is at most -10 % of the level, the prefill pool's fast way down
      holds no earlier tick's floor for the load ahead (`autoscale/prefill_down.py`, Round 15).
    - `prefill_fit_margin` (null: `margin`; in (0, 1]): the margin of the prefill pool's
      consolidation check (N-1 fits the observed load), apart from decode's
      (`autoscale/prefill_down.py`, Round 15).
    - `reversal_budget` (null: off; per pool, `{count: 2 (integer >= 2), window_s: 600}`): a
      down that would be a reversal waits while the pool's reversals of the last `window_s`
      and an up at once after it would pass `count` (`autoscale/reversal_budget.py`, Round 16).
    """

    headroom: float = Field(default=0.9, gt=0, le=1)
    margin: float = Field(default=0.8, gt=0, le=1)
    kv_high: float = Field(default=0.9, gt=0, le=1)
    min_samples: StrictInt = Field(default=20, ge=1)
    correction_alpha: float = Field(default=0.2, ge=0, le=1)
    stand_in: StrictBool = True
    forecast_window_s: float | None = Field(default=None, ge=0)
    trend_cap: float = Field(default=1.5, ge=1)
    trend_hold_s: float = Field(default=30.0, ge=0)
    fast_down_s: float = Field(default=60.0, ge=0)
    level_window_s: float | None = Field(default=None, ge=0)
    floor_hold_s: float | None = Field(default=None, ge=0)
    ahead_hold_s: float | None = Field(default=None, ge=0)
    decode_fit_as_floor: StrictBool = False
    trend_age: StrictBool = False
    release_after_ticks: StrictInt = Field(default=0, ge=0)
    decode_residence_mean: StrictBool = False
    decode_correction_on_target: StrictBool = False
    hysteresis: float = Field(default=0.1, ge=0, le=1)
    hysteresis_window_s: float = Field(default=600.0, ge=0)
    budget_margin: float = Field(default=0.2, ge=0, le=1)
    reversal_ticks: StrictInt = Field(default=6, ge=1)
    decode_wait_attribution: StrictBool = True
    cold_start_growth: dict[Pool, float] | None = None
    cold_start_spare: dict[Pool, float] | None = Field(
        default_factory=lambda: dict(DEFAULT_COLD_START_SPARE)
    )
    cold_start_spare_until_s: float | None = Field(default=None, ge=0)
    cold_start_spare_mode: SpareMode = SpareMode.LEARNT
    cold_start_spare_learnt: LearntSpareOptions = Field(default_factory=LearntSpareOptions)
    move_stabilization: StrictBool = False
    budget_keep_fleet: StrictBool = True
    move_release_check: StrictBool = False
    ramp_epsilon: float = Field(default=0.0, ge=0, lt=1)
    prefill_floor_hold_s: float | None = Field(default=None, ge=0)
    budget_now_first: StrictBool = True
    prefill_scale_down_s: float | None = Field(default=90.0, ge=0)
    prefill_fall_release: StrictBool = False
    prefill_fit_margin: float | None = Field(default=None, gt=0, le=1)
    reversal_budget: dict[Pool, ReversalBudgetOptions] | None = None

    @field_validator("cold_start_growth")
    @classmethod
    def _growth_at_least_one(cls, value: dict[Pool, float] | None) -> dict[Pool, float] | None:
        for pool, g in (value or {}).items():
            if not 1.0 <= g <= 10.0:
                raise ValueError(f"{pool.value}: growth {g} must be in [1, 10]")
        return value

    @field_validator("cold_start_spare")
    @classmethod
    def _spare_in_range(cls, value: dict[Pool, float] | None) -> dict[Pool, float] | None:
        for pool, x in (value or {}).items():
            if not 0.0 <= x <= 16.0:
                raise ValueError(f"{pool.value}: spare {x} replicas must be in [0, 16]")
        return value


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
    predictor_params: PredictorParams = Field(default_factory=PredictorParams)
    perf_model: PerfModelConfig = Field(default_factory=PerfModelConfig)
    role_switching: bool = False  # replicas are `kv_both`: move them between pools
    switch_s: float = Field(default=5.0, ge=0)  # drain + relabel time of one role move
    planner: PlannerOptions = Field(default_factory=PlannerOptions)  # pdorch's planner options

    @model_validator(mode="after")
    def _hardware_exists(self) -> SloPolicy:
        from pools.sim.profiles import get_gpu, get_model
        from pools.sim.timing import TimingModel

        try:
            model = get_model(self.model_profile)
        except KeyError as err:
            raise FieldPathError(("model_profile",), str(err.args[0])) from None
        try:
            gpu = get_gpu(self.gpu)
        except KeyError as err:
            raise FieldPathError(("gpu",), str(err.args[0])) from None
        try:
            TimingModel(model, gpu, tp=self.tp)
        except ValueError as err:
            raise FieldPathError(("tp",), str(err)) from None
        return self

    @model_validator(mode="after")
    def _budget_holds_minimums(self) -> SloPolicy:
        if self.gpu_budget is None:
            return self
        floor = sum(self.limits(p).min * self.limits(p).gpus_per_replica for p in Pool)
        if floor > self.gpu_budget:
            terms = " + ".join(
                f"{p.value} {self.limits(p).min}x{self.limits(p).gpus_per_replica}" for p in Pool
            )
            raise FieldPathError(
                ("gpu_budget",),
                f"budget {self.gpu_budget} GPUs is below the pools' minimums ({terms} = {floor} "
                "GPUs)",
            )
        return self

    def limits(self, pool: Pool) -> PoolLimits:
        return self.pools.get(pool, PoolLimits())

    def gpus_per_replica(self) -> dict[Pool, int]:
        """Pool → GPUs per replica (for `ScaleDecision.gpus`)."""
        return {p: self.limits(p).gpus_per_replica for p in Pool}


def parse_policy(
    data: Any,
    *,
    base_dir: Path | None = None,
    source: str | None = None,
    lines: dict[tuple[str | int, ...], int] | None = None,
) -> SloPolicy:
    """Validate a mapping (`None`: all defaults); PolicyError names every bad field (and its
    line, given `lines`). Relative `perf_model.sweep_file` is resolved against `base_dir`."""
    return validate_config(
        SloPolicy, data, PolicyError, base_dir=base_dir, source=source, lines=lines
    )


def load_policy(path_or_text: str | Path, *, base_dir: Path | None = None) -> SloPolicy:
    """Read and validate an SLO policy: a `Path`, a file name (a one-line string naming an
    existing file or ending in `.yaml`/`.yml`), or the YAML text itself.

    A file's relative `perf_model.sweep_file` is relative to the file's directory; text's to
    `base_dir` (default: the working directory). Raises PolicyError (`file:line: field.path:
    why`), also for YAML syntax errors; FileNotFoundError for a missing file.
    """
    source: str | None = None
    if isinstance(path_or_text, Path) or _names_a_file(path_or_text):
        path = Path(path_or_text)
        text = path.read_text(encoding="utf-8")
        source = str(path)
        base_dir = path.parent.resolve()
    else:
        text = path_or_text
        base_dir = (base_dir or Path.cwd()).resolve()
    data, lines = read_yaml(text, PolicyError, source)
    return parse_policy(data, base_dir=base_dir, source=source, lines=lines)


def _names_a_file(text: str) -> bool:
    if "\n" in text or not text.strip():
        return False
    return text.endswith((".yaml", ".yml")) or Path(text).is_file()
