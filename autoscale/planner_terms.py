"""The observation-driven terms of pdorch's planner: model corrections, reactive needs and the
consolidation (N → M) check. Pure functions of (perf model, policy, observation).

Notation (per pool): `λ_tok = rate·ISL·(1-hit)` observed uncached prompt tokens/s;
`t_own = perf.prefill_time_s(ISL_u)`; `μ = ISL_u / t_own` one prefill replica's raw tokens/s;
`C_p = perf.prefill_tokens_per_s(ISL_u, TTFT)` its capacity at the target; `Q` the uncached
prompt tokens queued on the prefill replicas; `S` the sequences on the decode replicas
(running + waiting); `B = sizing.corrected_batch` a decode replica's batch at the target under
the correction (`B_d(ctx, ITL)/k`, or with `on_target` `B_d(ctx, ITL/k)`: the KV pool and
`max_num_seqs` cap it whatever `k` says; `sizing`'s module docstring); `k` the pool's
correction factor (prefill capacities are divided by it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from autoscale.perf_model_base import PerfModel
from autoscale.policy import SloPolicy
from autoscale.signals import Observation, Pool, PoolStatus
from autoscale.sizing import (
    UNREACHABLE,
    context_tokens,
    corrected_batch,
    decode_burst,
    decode_concurrency,
    decode_need,
    itl_target_s,
    replicas_for,
    ttft_target_s,
    uncached_tokens,
)


@dataclass(frozen=True, slots=True)
class Term:
    """A replica count one rule asks for, the rule's name, and its inputs."""

    replicas: int
    reason: str
    inputs: dict[str, Any] = field(default_factory=dict)


def _enough(obs_count: int, min_samples: int) -> bool:
    return obs_count >= min_samples


def prefill_correction(
    perf: PerfModel,
    obs: Observation,
    min_samples: int,
    decode_wait: bool = False,
    leg: bool = False,
) -> float | None:
    """Observed mean TTFT / the model's mean TTFT at the observed load (None: not measurable).

    The model's mean is an M/D/1 response time per ready replica: prefill is close to a
    deterministic service of `t_own`, utilisation `rho = rate·t_own / N_ready`, so
    `TTFT ≈ t_own·(1 + rho / (2(1 - rho)))`. Skipped at `rho ≥ 0.9` (saturated: the queue, not the
    model, explains TTFT, and the reactive queue term handles it) and while sequences wait for
    a decode slot with `decode_wait` (`Observation.decode_waiting`: their TTFT holds that wait).

    With `leg` (policy `perf_model.online_prefill_signal: prefill-leg`) the observed side is the
    prefill leg's own mean (`Observation.prefill_leg`), against the same M/D/1 mean at the legs'
    mean uncached prompt and their rate: the end-to-end TTFT also holds the KV transfer and the
    decode replica's first step(s), which this model has no term for (on the 600 s day they
    kept this ratio at ~1.9 against a perfect model: `autoscale.perf_model_online`, "prefill
    signal"). A window without legs is not measurable then.
    """
    if leg:
        return _prefill_leg_correction(perf, obs, min_samples)
    ready = obs.pool(Pool.PREFILL).ready
    if ready <= 0 or not _enough(obs.ttft.count, min_samples) or not obs.ttft.mean_s:
        return None
    if decode_wait and obs.decode_waiting() > 0:  # TTFT then holds a decode slot's wait
        return None
    t_own = perf.prefill_time_s(uncached_tokens(obs.mean_isl_tokens, obs.prefix_hit_rate))
    rho = obs.arrival_rps * t_own / ready
    if t_own <= 0 or rho >= 0.9:
        return None
    predicted = t_own * (1.0 + rho / (2.0 * (1.0 - rho)))
    return obs.ttft.mean_s / predicted


def _prefill_leg_correction(perf: PerfModel, obs: Observation, min_samples: int) -> float | None:
    """`prefill_correction` on the prefill leg (its docstring)."""
    ready = obs.pool(Pool.PREFILL).ready
    legs = obs.prefill_leg
    if ready <= 0 or not _enough(legs.count, min_samples) or not legs.mean_s or obs.window_s <= 0:
        return None
    t_own = perf.prefill_time_s(max(1, round(obs.prefill_leg_uncached_tokens)))
    rho = legs.count / obs.window_s * t_own / ready
    if t_own <= 0 or rho >= 0.9:
        return None
    return legs.mean_s / (t_own * (1.0 + rho / (2.0 * (1.0 - rho))))


def _decode_batch_and_context(obs: Observation) -> tuple[float, int] | None:
    reps = obs.replicas_of(Pool.DECODE)
    running = sum(r.num_running for r in reps)
    if not reps or running <= 0:
        return None
    kv = sum(r.decode_kv_tokens for r in reps)
    ctx = (
        round(kv / running) if kv > 0 else context_tokens(obs.mean_isl_tokens, obs.mean_osl_tokens)
    )
    return running / len(reps), max(1, ctx)


def decode_correction(perf: PerfModel, obs: Observation, min_samples: int) -> float | None:
    """Observed mean ITL / the model's step time at the observed batch and context."""
    if not _enough(obs.itl.count, min_samples) or not obs.itl.mean_s:
        return None
    bc = _decode_batch_and_context(obs)
    if bc is None:
        return None
    predicted = perf.decode_step_s(max(1, round(bc[0])), bc[1])
    return obs.itl.mean_s / predicted if predicted > 0 else None


def _prefill_load(perf: PerfModel, policy: SloPolicy, obs: Observation) -> dict[str, float]:
    isl_u = uncached_tokens(obs.mean_isl_tokens, obs.prefix_hit_rate)
    t_own = perf.prefill_time_s(isl_u)
    return {
        "isl_uncached": float(isl_u),
        "t_own_s": t_own,
        "mu_tok_s": isl_u / t_own if t_own > 0 else 0.0,
        "cap_tok_s": perf.prefill_tokens_per_s(isl_u, ttft_target_s(policy)),
        "lambda_tok_s": obs.arrival_rps
        * obs.mean_isl_tokens
        * (1.0 - min(max(obs.prefix_hit_rate, 0.0), 1.0)),
        "queued_tokens": float(sum(r.queued_prefill_tokens for r in obs.replicas_of(Pool.PREFILL))),
    }


def _decode_load(
    perf: PerfModel, policy: SloPolicy, obs: Observation, correction: float, on_target: bool
) -> dict[str, float]:
    reps = obs.replicas_of(Pool.DECODE)
    itl = itl_target_s(policy)
    if reps:
        seqs = float(sum(r.num_running + r.num_waiting for r in reps))
        waiting = float(sum(r.num_waiting for r in reps))
    else:  # no per-replica signals: Little's law on what the clients saw
        ttft_seen = obs.ttft.mean_s or 0.0
        seqs = decode_concurrency(
            obs.arrival_rps, obs.mean_osl_tokens, ttft_seen, obs.itl.mean_s or itl
        )
        waiting = 0.0
    bc = _decode_batch_and_context(obs)
    ctx = bc[1] if bc else context_tokens(obs.mean_isl_tokens, obs.mean_osl_tokens)
    return {
        "sequences": seqs,
        "waiting": waiting,
        "context_tokens": float(ctx),
        # the batch at the target under the correction (`sizing.corrected_batch`)
        "batch_at_target": corrected_batch(perf, ctx, itl, correction, on_target),
        "kv_usage_sum": sum(r.kv_usage for r in reps),
    }


def _with_backlog(status: PoolStatus, steady: float, backlog: float, name: str) -> Term:
    """The steady need plus the backlog's; while replicas are pending the backlog is what they
    were asked for, so it may not push the count past the provisioned one (no cascade: the
    backlog keeps growing until they are ready, and re-counting it each tick would order more
    and more)."""
    full = replicas_for(steady + backlog)
    if status.pending == 0:
        return Term(full, name)
    held = max(replicas_for(steady), min(full, status.provisioned))
    return Term(held, name if held == full else name + "-pending")


def observed_breach(
    obs: Observation, pool: Pool, policy: SloPolicy, min_samples: int
) -> float | None:
    """The observed percentile (policy's) when it is over target and measurable, else None."""
    summ, tgt = (
        (obs.ttft, policy.slo.ttft_ms) if pool is Pool.PREFILL else (obs.itl, policy.slo.itl_ms)
    )
    value = summ.percentile(tgt.percentile)
    if value is None or not _enough(summ.count, min_samples):
        return None
    return value if value > tgt.target / 1000.0 else None


def reactive_term(
    perf: PerfModel,
    policy: SloPolicy,
    obs: Observation,
    pool: Pool,
    correction: float,
    *,
    min_samples: int,
    kv_high: float,
    start_s: float | None = None,
    decode_on_target: bool = False,
    decode_wait: bool = False,
) -> Term:
    """What the observed window needs now, whatever the forecast said.

    prefill: `N_q = ceil((Q_T / max(TTFT - t_own, T) + λ_tok) / (μ / k))` with `T` the time a
    new replica takes (`start_s`: the pool's `startup_s`, or `switch_s` when a role move can
    bring one) and `Q_T = max(0, Q - (N_prov·μ/k - λ_tok)·T)` the queue the provisioned
    replicas have not drained by the time a replica ordered now is ready: that rest is drained
    over one more start-up time, or within the TTFT budget when starts are instant (`T = 0`).
    decode: `N_s = ceil(S / B)` (`B` under the correction) and
    `N_kv = ceil(Σ kv_usage / kv_high)`.
    While replicas are pending, the backlog part (`Q`, waiting sequences) cannot raise the
    count above the provisioned replicas (`_with_backlog`).
    Both: an observed percentile over target adds one replica above the provisioned ones,
    unless some are pending (they are the coming capacity: no cascade). With `decode_wait`
    (the planner's `decode_wait_attribution`) a TTFT breach while sequences wait for a
    decode slot (`ttft_breach_is_decode`) adds it to decode (reason `ttft-decode-wait`), not
    to prefill, when prefill's own queue would serve in time.
    """
    status = obs.pool(pool)
    inputs: dict[str, Any]
    if pool is Pool.PREFILL:
        inputs = _prefill_load(perf, policy, obs)
        ttft = ttft_target_s(policy)
        budget = max(ttft - inputs["t_own_s"], 0.1 * ttft)
        mu = inputs["mu_tok_s"] / correction
        lam = inputs["lambda_tok_s"]
        start = policy.limits(pool).startup_s if start_s is None else start_s
        # what the provisioned replicas leave of the queue by the time a new one is ready,
        # drained over one more start-up time (within the TTFT budget when starts are instant)
        left = inputs["queued_tokens"] - (status.provisioned * mu - lam) * start
        inputs["backlog_at_start_tokens"] = max(0.0, left)
        steady = lam / mu if mu > 0 else 0.0
        backlog = max(0.0, left) / max(budget, start) / mu if mu > 0 else 0.0
        best = _with_backlog(status, steady, backlog, "ttft-queue")
    else:
        inputs = _decode_load(perf, policy, obs, correction, decode_on_target)
        batch = inputs["batch_at_target"]
        running = inputs["sequences"] - inputs["waiting"]
        if batch > 0:
            best = _with_backlog(
                status, running / batch, inputs["waiting"] / batch, "itl-concurrency-observed"
            )
        else:
            best = Term(UNREACHABLE, "itl-concurrency-observed")
        n_kv = math.ceil(inputs["kv_usage_sum"] / kv_high - 1e-9)
        if n_kv > best.replicas:
            best = Term(n_kv, "kv-usage")
    best = Term(best.replicas, best.reason, inputs)
    seen = observed_breach(obs, pool, policy, min_samples)
    name = "ttft-breach" if pool is Pool.PREFILL else "itl-breach"
    waiting = obs.decode_waiting() if decode_wait else 0
    ttft_seen = observed_breach(obs, Pool.PREFILL, policy, min_samples)
    if pool is Pool.PREFILL and seen is not None and waiting > 0:
        # the breach is decode's when sequences wait for a decode slot and the prefill
        # replicas' own queue would serve within the target (`ttft_breach_is_decode`)
        if ttft_breach_is_decode(perf, policy, obs, correction):
            best.inputs["breach_from"] = "decode"
            seen = None
    elif pool is Pool.DECODE and seen is None and ttft_seen is not None and waiting > 0:
        seen, name = ttft_seen, "ttft-decode-wait"  # decode grows for the TTFT it delays
    if seen is not None:
        step = 1 if status.pending == 0 else 0
        breach = Term(status.provisioned + step, name if step else name + "-pending", inputs)
        if breach.replicas > best.replicas:
            best = breach
    best.inputs["observed_breach_s"] = seen
    best.inputs["decode_waiting"] = waiting
    return best


def ttft_breach_is_decode(
    perf: PerfModel, policy: SloPolicy, obs: Observation, correction: float
) -> bool:
    """Is an observed TTFT breach the decode pool's? True when sequences wait for a decode
    slot (`Observation.decode_waiting` > 0: the decode replica emits the first token, so they
    wait for it) and the prefill pool's own wait, `t_own + (Q / N_ready) / (μ / k_p)` (its
    queued uncached tokens spread over its ready replicas, at the corrected raw rate), is
    within the TTFT target: prefill would have served in time, the decode slots did not.
    Why: on the 600 s day with `perf_model.decode_burst_queue`, one decode replica full
    through the ramp breached TTFT for two minutes and every breach added a prefill
    replica (8 where the oracle runs 2-4) while decode waited on its floor."""
    if obs.decode_waiting() <= 0:
        return False
    ready = obs.pool(Pool.PREFILL).ready
    x = _prefill_load(perf, policy, obs)
    mu = x["mu_tok_s"] / correction
    if ready <= 0 or mu <= 0:
        return False
    own = x["t_own_s"] + (x["queued_tokens"] / ready) / mu
    return own <= ttft_target_s(policy)


def decode_floor_need(
    perf: PerfModel,
    policy: SloPolicy,
    rate_rps: float,
    isl: float,
    osl: float,
    hit: float,
    correction: float,
    headroom: float,
    on_target: bool = False,
    dispersion: float | None = None,
) -> float:
    """The decode floor's model, one function for the floor and the fit check: fractional
    replicas `rate·(T_own + OSL·ITL) / (B·h)` (`sizing.decode_need`, `B` under the correction), with
    `T_own = min(perf.prefill_time_s(ISL_u), TTFT)` (the model's own prefill time: a request
    occupies its decode replica from its first token on, prefill queueing is not residence);
    with `perf_model.decode_burst_queue` the burst quantile of `sizing.decode_need`, its `I`
    the policy's unless `dispersion` (a learnt one, `autoscale.dispersion`) is given."""
    ttft = ttft_target_s(policy)
    t_own = perf.prefill_time_s(uncached_tokens(isl, hit)) if isl > 0 else 0.0
    fixed, q = decode_burst(policy)
    dispersion = fixed if fixed is None or dispersion is None else dispersion
    return decode_need(
        perf,
        rate_rps,
        isl,
        osl,
        itl_target_s(policy),
        ttft_term_s=min(t_own, ttft),
        correction=correction,
        headroom=headroom,
        correction_on_target=on_target,
        residence_at_step=policy.perf_model.decode_residence_at_batch_step,
        burst_dispersion=dispersion,
        burst_q=q,
    )


def fits(
    perf: PerfModel,
    policy: SloPolicy,
    obs: Observation,
    pool: Pool,
    replicas: int,
    correction: float,
    *,
    margin: float,
    min_samples: int,
    kv_high: float,
    decode_as_floor: bool = False,
    decode_on_target: bool = False,
) -> bool:
    """Would the observed load, spread over `replicas`, still meet the SLO with `margin`?

    prefill: `λ_tok ≤ margin·m·C_p/k` and `t_own + (Q/m)/(μ/k) ≤ margin·TTFT`.
    decode (`decode_as_floor` False): `S/m ≤ B` (under the correction), the predicted ITL
    `k·perf.decode_step_s(ceil(S/m), ctx) ≤ margin·ITL` and `Σ kv_usage / m ≤ margin·kv_high`.
    decode (`decode_as_floor` True): the floor's own model on the observed load,
    `decode_floor_need(rate, ISL, OSL, hit, k, headroom=margin) ≤ m`, and the KV check. Why:
    `S` is counted at the step time the current `N` replicas run (Azure x14: 6 ms, not the
    50 ms target), so `S/m` misses that consolidating lengthens every step and with it the
    time each sequence stays: the observed check allowed 3 decode replicas where the floor
    (Little's law at the target) asked 4, and the level's drift across that boundary flapped
    decode 3 <-> 4 (benchmarks/results/AUTOSCALE.md, Round 4).
    Never while the pool's observed percentile breaches its target.
    """
    if replicas <= 0:
        return False
    if observed_breach(obs, pool, policy, min_samples) is not None:
        return False
    m = float(replicas)
    if pool is Pool.PREFILL:
        x = _prefill_load(perf, policy, obs)
        if x["lambda_tok_s"] > margin * m * x["cap_tok_s"] / correction:
            return False
        mu = x["mu_tok_s"] / correction
        queue_wait = (x["queued_tokens"] / m) / mu if mu > 0 else 0.0
        return x["t_own_s"] + queue_wait <= margin * ttft_target_s(policy)
    y = _decode_load(perf, policy, obs, correction, decode_on_target)
    if decode_as_floor:
        need = decode_floor_need(
            perf,
            policy,
            obs.arrival_rps,
            obs.mean_isl_tokens,
            obs.mean_osl_tokens,
            obs.prefix_hit_rate,
            correction,
            margin,
            decode_on_target,
        )
        return replicas_for(need) <= replicas and y["kv_usage_sum"] / m <= margin * kv_high
    batch = math.ceil(y["sequences"] / m - 1e-9)
    if batch > y["batch_at_target"]:
        return False
    step = perf.decode_step_s(max(1, batch), round(y["context_tokens"])) * correction
    if step > margin * itl_target_s(policy):
        return False
    return y["kv_usage_sum"] / m <= margin * kv_high
