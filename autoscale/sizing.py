"""Pool sizing from a load and the per-replica performance model (shared by the planners).

Prefill (TTFT): `N_p = ceil(rate · ISL · (1 - hit) / (C_p(ISL_u, TTFT) · h / k_p))` where
`C_p = perf.prefill_tokens_per_s` is the prompt tokens/s one replica sustains at the TTFT target
for `ISL_u = ISL·(1 - hit)` uncached tokens.

Decode (ITL): sequences in flight by Little's law `S = rate · (T_ttft + OSL · ITL)`, and
`N_d = ceil(S / (B_d(ctx, ITL) · h / k_d))` with `B_d = perf.decode_max_batch` at the context
`ctx = ISL + OSL/2` (a sequence is half-way through its output on average); with
`correction_on_target`, `N_d = ceil(S / (B_d(ctx, ITL / k_d) · h))` (below).

`h` is a headroom (1.0 = run replicas exactly at the target; pdorch's planner uses 0.9) and
`k` a correction factor (observed/predicted latency, 1.0 = trust the model).

`correction_on_target` (default False: the batch is divided by `k`): the decode correction
scales the *step time* (observed ITL / the model's step), so it moves the ITL target the
step-bound batch is read at (`k·D(b, ctx) ≤ ITL` ⇔ `D(b, ctx) ≤ ITL/k`; Dynamo's planner
corrects its ITL target the same way), and `max_num_seqs` and the KV pool cap `B_d` whatever
`k` says. Dividing the capped batch on the Mooncake trace (13.7k-token contexts, KV-bound at
32 sequences per replica, `k_d` at its 0.5 bound) counted 64 sequences per replica, twice
what the KV pool holds. Not the default: the corrected floor asks ~4 decode replicas there
(the oracle's count), but the shared GPU budget then gives prefill fewer and Mooncake loses
TTFT attainment (benchmarks/results/AUTOSCALE.md, Round 7).

`residence_at_step` (the policy's `perf_model.decode_residence_at_batch_step`, default False):
a sequence's residence is `OSL · min(ITL, k·D(B, ctx))`, the step time at the batch `B` the
sizing packs per replica, not `OSL · ITL`. Why: Little's law at the ITL target is the fixed
point only when `B` is step-bound (`D(B) = ITL`); when `max_num_seqs` or the KV pool caps `B`
the replicas run faster than the target and each sequence leaves sooner. Llama-3.1-8B on H100
at the diurnal day's contexts (1.1-2.2k tokens): `B` = 256 (`max_num_seqs`) at 16-22 ms a step,
so `OSL · 50 ms` counted 2.3-3x the sequences in flight; a fixed 2P + 3D fleet (static-mean)
met both SLOs all 2-hour day with p90 ITL 15.6 ms at the 97 rps peak, where this model sizes
5 decode replicas (benchmarks/results/AUTOSCALE.md, Round 8).

`burst_dispersion` (the policy's `perf_model.decode_burst_queue`, default False; its `I` is
`perf_model.decode_burst_dispersion`, default 16): the residence at the packed batch's step,
plus the queue a burst builds in front of the capped batch. Why: sized on the mean in flight,
`m = rate · (T_ttft + OSL·k·D(B, ctx))`, a window's replicas are full on average only; a burst
that brings more than `N·B` sequences within one residence waits for a slot, and the first
token (the decode replica emits it) waits with it, so TTFT misses (Round 8: the oracle sized
that way held 79 % on the Azure x14 prefix, its misses all TTFT). Formula: the sequences in
flight at an arrival are the arrivals of the last residence; for Poisson arrivals that count
is Poisson(m) whatever the service time (M/G/inf), for clustered arrivals its variance is
`I·m` (`I` the index of dispersion, var/mean, of the arrivals counted over one residence).
The need is its q-quantile by the normal approximation over the packed batch:

    S_q = m + z_q · sqrt(I · m),   N_d = ceil(S_q / (B · h / k)),   z_q = Phi^-1(q)

with `q` the TTFT percentile (0.99: z = 2.326). The wait a slot takes to free (`B / R` per
replica per second) is not credited: the prefill model already spends the TTFT budget at its
percentile. Measured per 60 s window (`benchmarks/results/autoscale-round9/README.md`, the
p99 of the sequences in flight at each arrival against `m`): `I` = 7-25 on the Azure x14
prefix (14 overlaid copies of each request within 1 s), 1-21 on the 600 s diurnal day, 1-5 on
the Mooncake x2 prefix (windows inside the trace); the default 16 tracks the first two's busy
windows within -8 % / +21 % of the counted p99 and counts 1.4-1.8x it on the third.
The oracle, which knows the trace, counts the sequences in flight exactly instead
(`autoscale/baselines/oracle.py`, `decode_in_flight_quantile`).

**KV term** (with the burst queue, pdorch's and the oracle's one formula, `kv_tokens_held`
and `kv_replicas`): the need is also at least the KV tokens in flight over one replica's
usable KV pool, each sequence holding `ISL + OSL/2` tokens (its prompt and, on average over
its residence, half its answer):

    N_d = max(S_q / (B·h/k),  S_q·(ISL + OSL/2) / (U·h))

`U = perf.kv_usable_tokens()` (skipped where the model has none), `h` the headroom. The
correction `k` (observed ITL over the model's step) scales the step time, not the KV a
sequence holds, so it does not divide the KV side: on the Mooncake trace (13k-token contexts,
KV-bound at ~30 sequences a replica) a fast-reading `k` of 0.5 doubled `B / k` past what the
KV pool holds (Round 7). At `k = 1` the term never binds (`B` is the KV cap at the mean
context, block-rounded down), so `size_window`'s sizing is unchanged. The oracle counts the
trace's own tokens in flight (`autoscale/baselines/oracle_decode.py`); pdorch estimates them as
`S_q` mean contexts (no term for the spread of contexts: on whole Mooncake `E[w²]/E[w]²` is
2.7, which would widen the z-term by `sqrt(1 + (2.7-1)/I)`, 5 % at `I` = 16).
"""

from __future__ import annotations

import math
from statistics import NormalDist

from autoscale.load_window import LoadWindow
from autoscale.perf_model_base import PerfModel
from autoscale.policy import SloPolicy
from autoscale.signals import Pool

UNREACHABLE = 10**6  # replicas "needed" when the target cannot be met at all (then max binds)


def ttft_target_s(policy: SloPolicy) -> float:
    return policy.slo.ttft_ms.target / 1000.0


def itl_target_s(policy: SloPolicy) -> float:
    return policy.slo.itl_ms.target / 1000.0


def uncached_tokens(isl: float, hit: float) -> int:
    return max(1, round(isl * (1.0 - min(max(hit, 0.0), 1.0))))


def kv_tokens_held(isl: float, osl: float) -> float:
    """KV tokens a decoding sequence holds on average over its residence: `ISL + OSL/2`."""
    return isl + osl / 2.0


def context_tokens(isl: float, osl: float) -> int:
    return max(1, round(kv_tokens_held(isl, osl)))


def kv_replicas(perf: PerfModel, kv_tokens: float, headroom: float = 1.0) -> float | None:
    """Fractional decode replicas whose usable KV holds `kv_tokens` at `headroom` (the module
    docstring's KV term); None where the model does not say how much KV a replica has."""
    usable = perf.kv_usable_tokens()
    if usable is None:
        return None
    cap = usable * headroom
    return kv_tokens / cap if cap > 0 else math.inf


def replicas_for(need: float) -> int:
    """Whole replicas for a fractional need (a hair of float noise does not add one)."""
    if math.isinf(need) or need >= UNREACHABLE:
        return UNREACHABLE
    return max(0, math.ceil(need - 1e-9))


def prefill_need(
    perf: PerfModel,
    rate_rps: float,
    isl: float,
    hit: float,
    ttft_s: float,
    *,
    correction: float = 1.0,
    headroom: float = 1.0,
) -> float:
    """Fractional prefill replicas for the load (module docstring)."""
    if rate_rps <= 0 or isl <= 0:
        return 0.0
    isl_u = uncached_tokens(isl, hit)
    cap = perf.prefill_tokens_per_s(isl_u, ttft_s) * headroom / correction
    if cap <= 0:
        return math.inf
    return rate_rps * isl * (1.0 - min(max(hit, 0.0), 1.0)) / cap


def corrected_batch(
    perf: PerfModel, ctx: int, itl_s: float, correction: float, on_target: bool
) -> float:
    """A decode replica's batch at the ITL target under the correction `k`: `B_d(ctx, ITL/k)`
    with `on_target` (the KV and `max_num_seqs` caps hold), else `B_d(ctx, ITL) / k`."""
    if on_target:
        return float(perf.decode_max_batch(ctx, itl_s / correction))
    return perf.decode_max_batch(ctx, itl_s) / correction


def decode_concurrency(rate_rps: float, osl: float, ttft_term_s: float, itl_s: float) -> float:
    """Sequences in flight (Little's law): rate · (TTFT + OSL · ITL)."""
    return max(0.0, rate_rps) * (ttft_term_s + osl * itl_s)


def burst_quantile(mean: float, dispersion: float, q: float) -> float:
    """`S_q = m + z_q·sqrt(I·m)` of the module docstring (0 for `m <= 0`)."""
    if mean <= 0:
        return 0.0
    z = NormalDist().inv_cdf(min(max(q, 0.5), 1.0 - 1e-12))
    return mean + z * math.sqrt(max(1.0, dispersion) * mean)


def packed_step_s(
    perf: PerfModel, batch: float, ctx: int, itl_s: float, correction: float
) -> float:
    """`min(ITL, k·D(ceil(B), ctx))`: the step of the batch the sizing packs per replica."""
    return min(itl_s, correction * perf.decode_step_s(max(1, math.ceil(batch)), ctx))


def decode_need(
    perf: PerfModel,
    rate_rps: float,
    isl: float,
    osl: float,
    itl_s: float,
    *,
    ttft_term_s: float,
    correction: float = 1.0,
    headroom: float = 1.0,
    correction_on_target: bool = False,
    residence_at_step: bool = False,
    burst_dispersion: float | None = None,
    burst_q: float = 0.99,
) -> float:
    """Fractional decode replicas for the load (module docstring); `burst_dispersion` not None
    adds the burst queue (its `I`) at quantile `burst_q`, on the packed batch's residence, and
    the KV term."""
    if rate_rps <= 0 or osl <= 0:
        return 0.0
    ctx = context_tokens(isl, osl)
    if correction_on_target:
        batch = corrected_batch(perf, ctx, itl_s, correction, True) * headroom
    else:  # main's expression, in its order (bit-identical results)
        batch = perf.decode_max_batch(ctx, itl_s) * headroom / correction
    if batch <= 0:
        return math.inf
    step_s = itl_s
    if residence_at_step or burst_dispersion is not None:
        step_s = packed_step_s(perf, batch, ctx, itl_s, correction)
    mean = decode_concurrency(rate_rps, osl, ttft_term_s, step_s)
    if burst_dispersion is None:
        return mean / batch
    seqs = burst_quantile(mean, burst_dispersion, burst_q)
    # and the KV those sequences hold, whatever `k` says (module docstring, "KV term")
    kv = kv_replicas(perf, seqs * kv_tokens_held(isl, osl), headroom)
    return seqs / batch if kv is None else max(seqs / batch, kv)


def decode_burst(policy: SloPolicy) -> tuple[float | None, float]:
    """`decode_need`'s `(burst_dispersion, burst_q)` as the policy sets them (module docstring):
    `I` or None (off), and the TTFT percentile as a fraction."""
    cfg = policy.perf_model
    q = policy.slo.ttft_ms.percentile / 100.0
    return (cfg.decode_burst_dispersion if cfg.decode_burst_queue else None), q


def size_window(
    perf: PerfModel, policy: SloPolicy, window: LoadWindow, *, headroom: float = 1.0
) -> dict[Pool, int]:
    """Fewest replicas per pool that meet both targets for `window`'s load, per the model.

    The decode Little's-law TTFT term is the model's own prefill time of the uncached prompt
    (what a request waits when prefill is sized right), not the TTFT target.
    """
    w = window
    ttft = ttft_target_s(policy)
    itl = itl_target_s(policy)
    p = prefill_need(
        perf, w.arrival_rps, w.mean_isl_tokens, w.prefix_hit_rate, ttft, headroom=headroom
    )
    t_own = perf.prefill_time_s(uncached_tokens(w.mean_isl_tokens, w.prefix_hit_rate))
    dispersion, q = decode_burst(policy)
    d = decode_need(
        perf,
        w.arrival_rps,
        w.mean_isl_tokens,
        w.mean_osl_tokens,
        itl,
        ttft_term_s=min(t_own, ttft),
        headroom=headroom,
        residence_at_step=policy.perf_model.decode_residence_at_batch_step,
        burst_dispersion=dispersion,
        burst_q=q,
    )
    return {Pool.PREFILL: replicas_for(p), Pool.DECODE: replicas_for(d)}


def clamp_to_limits(policy: SloPolicy, pool: Pool, n: int) -> tuple[int, str | None]:
    """`n` within the pool's [min, max]; the second item names the bound that bit, if any."""
    lim = policy.limits(pool)
    if n < lim.min:
        return lim.min, "min"
    if n > lim.max:
        return lim.max, "max"
    return n, None
