"""The online fit: a prior's curves corrected by observed prefill and decode times.

Split from `autoscale/perf_model.py` (which builds it from the policy); behaviour unchanged.
The capacity rules are `autoscale.perf_model_curve`'s.

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

from autoscale.perf_model_curve import CurvePerfModel
from autoscale.policy import PrefillSignal
from autoscale.signals import Observation, Pool


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
