"""Per-replica capacity at a latency target: from the timing model, a sweep, or online.

Every model here answers the `PerfModel` questions from two per-replica curves, the prefill
time of one prompt alone `S(n)` and the decode step time `D(b, c)` of `b` sequences of `c`
context tokens each, plus the replica's limits (KV capacity, `max_num_seqs`). The rules that
turn the curves into capacity are shared (`CurvePerfModel`):

Prefill: tokens/s at a TTFT target (`prefill_tokens_per_s(n, target)`). A prefill replica is
modelled as one FIFO server (M/D/1): requests of `n` uncached tokens arrive Poisson at rate
lambda and each takes `S = S(n)`; utilisation `rho = lambda*S`. The waiting time's tail is
approximated as exponential with the M/D/1 mean (Pollaczek-Khinchine):

    P(W > 0) = rho,   E[W | W > 0] = S / (2(1 - rho)),
    w_q = S / (2(1 - rho)) * ln(rho / (1 - q))   if rho > 1 - q, else 0
    TTFT_q = S + w_q + t_transfer(n)

where `q` is the percentile (0.99) and `t_transfer` the KV transfer to the decode replica
(`include_transfer`, default on for the timing model; a sweep measured end-to-end TTFT, so
its `S` already contains what a live engine adds). `rho*` is the largest `rho ≤ rho_max`
(default 0.9, burst headroom) with `TTFT_q ≤ target`, found by bisection (`TTFT_q` rises
monotonically in rho); the answer is `rho* · n / S` tokens/s, 0 when `S + t_transfer` alone
exceeds the target. Serving prefills one at a time is conservative: vLLM packs several short
prompts into one `max_num_batched_tokens` step.

Decode: sequences at an ITL target (`decode_max_batch(c, target)`): the largest `b` with
`D(b, c) ≤ target` (bisection; `D` rises in `b`), capped by `max_num_seqs` and by the KV pool:
`b · ceil(c / block_size) ≤ kv_usage_max · (num_gpu_blocks - 1)` (vLLM's null block is not
usable). 0 when even `b = 1` misses the target.

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
- `OnlinePerfModel(prior)`: the prior's curves times a correction per pool, `S = k_p·S_prior`,
  `D = k_d·D_prior`, each fitted by exponentially weighted least squares of observed against
  predicted through the origin: `k = Σ w·obs·pred / Σ w·pred²` with weight
  `w = 2^(-age / half_life_s)` (default 300 s), clamped to [0.25, 4]; 1 before any sample.
  A sample more than `max_correction` x its prediction is not learnt (`observe`): a prefill
  median that far out is a drained backlog; with `skip_decode_outliers` (policy
  `perf_model.online_skip_decode_outliers`, default off: Round 7 measured it only together
  with the planner's decode options), a decode replica's mean step that far out is not
  a decode step but prefill-sized work on it (e.g. a preempted sequence's recompute). The
  least-squares ratio weighs a sample by `obs·pred`, so such rare windows would set `k`: on the
  Mooncake trace 9 of 808 replica-windows (1 %) at 0.1-0.8 s, where the decode step the model
  predicts is 5-30 ms, held `k_d` at 2-3 while the median observed/predicted step was 0.91
  (benchmarks/results/AUTOSCALE.md, Round 7).

Prefill signal (`prefill_signal`, policy `perf_model.online_prefill_signal`):
- `ttft` (default): the window's median TTFT against `S(n̄_u) + t_transfer(n̄_u)`, `n̄_u` the
  arrivals' mean uncached ISL, learnt only while no prefill replica has a queue at the read.
  That TTFT also holds what the prior does not model: the decode replica's scheduling of the
  remote KV load and the step that emits the first token (one to two decode steps of 10-20 ms
  on H100), the wait for the prefill step in flight and the prompts packed into one step. At
  Azure's ~1k-token prompts (`S` ≈ 26 ms) that is most of the TTFT: on the 600 s day the fit
  read k_p 1.8-1.9 from an engine whose prefill is the prior's exactly, and the prefill floor
  ran ~2x the replicas the oracle needs (Round 11, `benchmarks/results/autoscale-round11-fit/`).
- `prefill-leg`: the prefill leg's own mean duration `L̄` (`Observation.prefill_leg`: arrival
  to the prefill's end; the simulator times it, live it is the prefill engines'
  `vllm:time_to_first_token_seconds`) against the model's mean leg at the observed load, the
  M/D/1 response time of the prefill service `kS` (`S = S_prior(n̄_L)` at the legs' own mean
  uncached prompt `n̄_L`):

      L̄ = kS·(1 + rho(k) / (2(1 - rho(k)))),   rho(k) = k·rho0,   rho0 = (legs / window)·S / N_ready

  solved for the window's `k_w` by bisection (the right side rises in k); the sample learnt is
  `(pred S, obs k_w·S)`. The mean, not the median: `S` is affine in the prompt (below the chunk
  size), so the mean leg of mixed prompts is `S` of their mean prompt, while a median of a
  right-skewed ISL mix is not. Learnt only while no prefill replica has a queue at the read,
  `rho(k_w) < rho_max` and `k_w` within [`min_correction`, `max_correction`] (else queueing, not
  service, explains the window); a window without legs (a source that cannot time them) is
  not learnt. The M/D/1 wait over-counts vLLM's packing of several prompts into one step a
  little (their `S` shares one step's overhead), so `k` errs low by a few % at load.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path

from autoscale.perf_model_base import PerfModel
from autoscale.perf_sweep import Sweep
from autoscale.policy import PerfModelSource, PrefillSignal, SloPolicy
from autoscale.signals import Observation, Pool
from pools.sim.timing import TimingModel, make_timing

DEFAULT_RHO_MAX = 0.9
DEFAULT_PERCENTILE = 99.0


def ttft_at_percentile(service_s: float, rho: float, q: float) -> float:
    """`S + w_q` of the module docstring: the q-quantile (0 < q < 1) of wait + service."""
    if rho <= 0:
        return service_s
    if rho >= 1:
        return math.inf
    if rho <= 1 - q:
        return service_s
    return service_s + service_s / (2 * (1 - rho)) * math.log(rho / (1 - q))


def mean_response_s(service_s: float, rho: float) -> float:
    """M/D/1 mean response time (Pollaczek-Khinchine): `S·(1 + rho / (2(1 - rho)))`."""
    if rho >= 1:
        return math.inf
    return service_s * (1.0 + max(0.0, rho) / (2.0 * (1.0 - rho)))


def leg_correction(
    mean_leg_s: float, service_s: float, rho0: float, lo: float, hi: float, rho_max: float
) -> float | None:
    """`k` with `mean_response_s(k·S, k·rho0) = L̄` (module docstring, "prefill-leg"); None when
    no `k` in [lo, hi] with `k·rho0 ≤ rho_max` explains the leg (queueing, not service)."""
    if service_s <= 0 or mean_leg_s <= 0 or not math.isfinite(mean_leg_s):
        return None
    top = hi if rho0 <= 0 else min(hi, rho_max / rho0)
    if top < lo:
        return None

    def leg(k: float) -> float:
        return mean_response_s(k * service_s, k * rho0)

    if leg(lo) > mean_leg_s or leg(top) < mean_leg_s:
        return None
    a, b = lo, top
    for _ in range(60):
        mid = (a + b) / 2
        if leg(mid) < mean_leg_s:
            a = mid
        else:
            b = mid
    return (a + b) / 2


def max_utilisation(
    service_s: float, budget_s: float, q: float, rho_max: float = DEFAULT_RHO_MAX
) -> float:
    """Largest rho ≤ rho_max with `ttft_at_percentile(S, rho, q) ≤ budget_s` (0 if none)."""
    if service_s <= 0 or service_s > budget_s:
        return 0.0
    if ttft_at_percentile(service_s, rho_max, q) <= budget_s:
        return rho_max
    lo, hi = 0.0, rho_max
    for _ in range(60):
        mid = (lo + hi) / 2
        if ttft_at_percentile(service_s, mid, q) <= budget_s:
            lo = mid
        else:
            hi = mid
    return lo


class CurvePerfModel(PerfModel):
    """The capacity rules over `prefill_time_s` and `decode_step_s` (module docstring).

    `percentile` is the TTFT tail the prefill rule keeps (default 99), `rho_max` the prefill
    utilisation cap, `kv_usage_max` the share of the KV pool decode may fill (default 1.0)."""

    def __init__(
        self,
        *,
        kv_capacity_tokens: int,
        max_num_seqs: int,
        block_size: int = 16,
        percentile: float = DEFAULT_PERCENTILE,
        rho_max: float = DEFAULT_RHO_MAX,
        kv_usage_max: float = 1.0,
    ) -> None:
        if not 0 < percentile < 100:
            raise ValueError(f"percentile must be in (0, 100), got {percentile}")
        if not 0 < rho_max < 1:
            raise ValueError(f"rho_max must be in (0, 1), got {rho_max}")
        self.kv_capacity_tokens = kv_capacity_tokens
        self.max_num_seqs = max_num_seqs
        self.block_size = block_size
        self.percentile = percentile
        self.rho_max = rho_max
        self.kv_usage_max = kv_usage_max

    def transfer_s(self, uncached_tokens: int) -> float:
        """Time TTFT spends outside the prefill replica's queue and step (default 0)."""
        return 0.0

    @abstractmethod
    def prefill_time_s(self, uncached_tokens: int) -> float: ...

    @abstractmethod
    def decode_step_s(self, batch: int, context_tokens: int) -> float: ...

    def prefill_utilisation(self, isl_uncached_tokens: int, ttft_target_s: float) -> float:
        """rho* of the module docstring."""
        n = max(1, isl_uncached_tokens)
        service = self.prefill_time_s(n)
        budget = ttft_target_s - self.transfer_s(n)
        return max_utilisation(service, budget, self.percentile / 100.0, self.rho_max)

    def prefill_tokens_per_s(self, isl_uncached_tokens: int, ttft_target_s: float) -> float:
        n = max(1, isl_uncached_tokens)
        rho = self.prefill_utilisation(n, ttft_target_s)
        return rho * n / self.prefill_time_s(n) if rho > 0 else 0.0

    def estimated_ttft_s(
        self,
        uncached_tokens: int,
        queued_prefill_tokens: int = 0,
        mean_queued_isl_tokens: int | None = None,
    ) -> float:
        """TTFT of a request of `uncached_tokens` arriving at a replica with
        `queued_prefill_tokens` ahead of it: the queue drains as prompts of
        `mean_queued_isl_tokens` (default: this one's size), `q/m · S(m)`, then its own
        `S(n)` and the transfer. The per-replica signal of a reactive (load-mode) step."""
        n = max(1, uncached_tokens)
        wait = 0.0
        if queued_prefill_tokens > 0:
            m = max(1, mean_queued_isl_tokens or n)
            wait = queued_prefill_tokens / m * self.prefill_time_s(m)
        return wait + self.prefill_time_s(n) + self.transfer_s(n)

    def kv_usable_blocks(self) -> int:
        """KV blocks decode may fill: `kv_usage_max` of the pool, the null block excluded."""
        return int(self.kv_usage_max * (self.kv_capacity_tokens // self.block_size - 1))

    def kv_usable_tokens(self) -> int:
        return self.kv_usable_blocks() * self.block_size

    def kv_max_batch(self, context_tokens: int) -> int:
        """Sequences of `context_tokens` the KV pool holds (block-rounded, null block excluded)."""
        blocks_per_seq = max(1, math.ceil(context_tokens / self.block_size))
        return max(0, self.kv_usable_blocks() // blocks_per_seq)

    def decode_max_batch(self, context_tokens: int, itl_target_s: float) -> int:
        cap = min(self.max_num_seqs, self.kv_max_batch(context_tokens))
        if cap < 1 or self.decode_step_s(1, context_tokens) > itl_target_s:
            return 0
        if self.decode_step_s(cap, context_tokens) <= itl_target_s:
            return cap
        lo, hi = 1, cap  # step(lo) ≤ target < step(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.decode_step_s(mid, context_tokens) <= itl_target_s:
                lo = mid
            else:
                hi = mid
        return lo


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

    @classmethod
    def from_profiles(
        cls, model_profile: str, gpu: str, tp: int = 1, **kwargs: object
    ) -> TimingPerfModel:
        """From profile names (`pdorch profile`); KeyError lists the valid names."""
        return cls(make_timing(model_profile, gpu, tp=tp), **kwargs)  # type: ignore[arg-type]

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


class _WeightedRatio:
    """`k = Σ w·obs·pred / Σ w·pred²` with `w = 2^(-age/half_life)` (decayed running sums)."""

    def __init__(self, half_life_s: float) -> None:
        self.half_life_s = half_life_s
        self.sxy = 0.0
        self.sxx = 0.0
        self.count = 0
        self.last_now: float | None = None

    def add(self, now: float, predicted: float, observed: float) -> None:
        if predicted <= 0 or observed <= 0 or not math.isfinite(observed):
            return
        if self.last_now is not None and now > self.last_now:
            decay = 2.0 ** (-(now - self.last_now) / self.half_life_s)
            self.sxy *= decay
            self.sxx *= decay
        if self.last_now is None or now > self.last_now:
            self.last_now = now
        self.sxy += observed * predicted
        self.sxx += predicted * predicted
        self.count += 1

    def value(self) -> float | None:
        return self.sxy / self.sxx if self.sxx > 0 else None


class OnlinePerfModel(CurvePerfModel):
    """A prior's curves corrected by observed prefill and decode times (module docstring).

    Feed it `observe_prefill(now, uncached_tokens, seconds)` (a prefill's service time, or
    TTFT at an idle queue), `observe_decode(now, batch, context_tokens, step_s)`, or a whole
    `observe(observation)`; `correction(pool)` is the current factor."""

    def __init__(
        self,
        prior: CurvePerfModel,
        *,
        half_life_s: float = 300.0,
        min_correction: float = 0.25,
        max_correction: float = 4.0,
        skip_decode_outliers: bool = False,
        skip_decode_wait: bool = False,
        prefill_signal: PrefillSignal = PrefillSignal.TTFT,
    ) -> None:
        super().__init__(
            kv_capacity_tokens=prior.kv_capacity_tokens,
            max_num_seqs=prior.max_num_seqs,
            block_size=prior.block_size,
            percentile=prior.percentile,
            rho_max=prior.rho_max,
            kv_usage_max=prior.kv_usage_max,
        )
        if not 0 < min_correction <= max_correction:
            raise ValueError("need 0 < min_correction <= max_correction")
        self.prior = prior
        self.min_correction = min_correction
        self.max_correction = max_correction
        self.skip_decode_outliers = skip_decode_outliers
        self.skip_decode_wait = skip_decode_wait
        self.prefill_signal = prefill_signal
        self._fits = {p: _WeightedRatio(half_life_s) for p in Pool}

    def correction(self, pool: Pool) -> float:
        k = self._fits[pool].value()
        if k is None:
            return 1.0
        return min(self.max_correction, max(self.min_correction, k))

    def samples(self, pool: Pool) -> int:
        return self._fits[pool].count

    def observe_prefill(self, now: float, uncached_tokens: int, seconds: float) -> None:
        n = max(1, uncached_tokens)
        self._fits[Pool.PREFILL].add(
            now, self.prior.prefill_time_s(n) + self.prior.transfer_s(n), seconds
        )

    def observe_decode(self, now: float, batch: int, context_tokens: int, step_s: float) -> None:
        if batch >= 1:
            self._fits[Pool.DECODE].add(
                now, self.prior.decode_step_s(batch, context_tokens), step_s
            )

    def observe(self, observation: Observation) -> None:
        """Decode: every decode replica with a step time and running sequences (context =
        its decode KV tokens / running), with `skip_decode_outliers` only one whose mean step
        is within `max_correction` x the prior's (else it is not decode work: module
        docstring). Prefill: the window's median TTFT against the mean uncached ISL, only when
        no prefill replica has a queue (with `skip_decode_wait`, and no sequence waits for a
        decode slot; then TTFT ≈ service time) and the median is within `max_correction` x
        the prior's (else it is queueing)."""
        o = observation
        for r in o.replicas_of(Pool.DECODE):
            if r.mean_step_s is not None and r.num_running > 0:
                context = r.decode_kv_tokens // r.num_running
                expected = self.prior.decode_step_s(r.num_running, context)
                if not self.skip_decode_outliers or r.mean_step_s <= self.max_correction * expected:
                    self.observe_decode(o.now, r.num_running, context, r.mean_step_s)
        prefill = o.replicas_of(Pool.PREFILL)
        # a sequence waiting for a decode slot waits for its first token too (the decode
        # replica emits it): such a window's TTFT is not prefill service (on the 600 s day
        # with the decode burst queue it taught the fit a 3x slower prefill: 8 replicas)
        idle_queues = all(r.num_waiting == 0 for r in prefill)
        if self.prefill_signal is PrefillSignal.PREFILL_LEG:
            if idle_queues:
                self._observe_prefill_leg(o, len(prefill))
            return
        if self.skip_decode_wait:
            idle_queues = idle_queues and o.decode_waiting() == 0
        if o.ttft.p50_s is not None and o.num_requests > 0 and idle_queues:
            uncached = int(o.mean_isl_tokens * (1.0 - o.prefix_hit_rate))
            n = max(1, uncached)
            expected = self.prior.prefill_time_s(n) + self.prior.transfer_s(n)
            # queues empty at the read do not mean they were empty all window: a median past
            # max_correction x the prior is a drained backlog, not a slower engine (on Azure
            # one such window, 30 s medians, tripled the prefill service time the planners
            # sized with, for a whole half-life)
            if o.ttft.p50_s <= self.max_correction * expected:
                self.observe_prefill(o.now, uncached, o.ttft.p50_s)

    def _observe_prefill_leg(self, o: Observation, prefill_replicas: int) -> None:
        """One window's prefill-leg sample (module docstring, "prefill-leg")."""
        leg = o.prefill_leg
        ready = o.pool(Pool.PREFILL).ready or prefill_replicas
        if leg.count <= 0 or leg.mean_s is None or ready <= 0 or o.window_s <= 0:
            return
        n = max(1, round(o.prefill_leg_uncached_tokens))
        service = self.prior.prefill_time_s(n)
        rho0 = leg.count / o.window_s * service / ready
        k = leg_correction(
            leg.mean_s, service, rho0, self.min_correction, self.max_correction, self.rho_max
        )
        if k is not None:
            self._fits[Pool.PREFILL].add(o.now, service, k * service)

    def transfer_s(self, uncached_tokens: int) -> float:
        return self.correction(Pool.PREFILL) * self.prior.transfer_s(uncached_tokens)

    def prefill_time_s(self, uncached_tokens: int) -> float:
        return self.correction(Pool.PREFILL) * self.prior.prefill_time_s(uncached_tokens)

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        return self.correction(Pool.DECODE) * self.prior.decode_step_s(batch, context_tokens)


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
