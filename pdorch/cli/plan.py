"""`pdorch plan`: capacity planning, replicas per pool and GPUs for a load, with the binding term.

The sizing math is `autoscale/sizing.py` over the policy's performance model
(`autoscale.perf_model.build_perf_model`), the same the planner runs each tick:

- prefill: `need_p = rate · ISL · (1 - hit) / (C_p(ISL_u, TTFT) · h)`, binding term
  `ttft-throughput`;
- decode: `need_d = rate · (T_prefill + OSL · ITL) / (B_d(ctx, ITL) · h)`, binding term
  `kv-capacity` when the KV pool caps the batch `B_d`, else `itl-batch`;

then each count is clamped to the pool's `min`/`max` (binding term `min`/`max`), and the total
is checked against `gpu_budget` (`over-budget` when it does not fit). `h` is `--headroom`.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import typer


def plan(
    policy: Path = typer.Option(
        ..., "--policy", help="SLO policy YAML (deploy/examples/slo-policy.yaml).", exists=True
    ),
    rate_rps: float = typer.Option(..., "--rate-rps", help="Arrival rate, in requests/s."),
    isl_tokens: float = typer.Option(..., "--isl-tokens", help="Mean prompt tokens."),
    osl_tokens: float = typer.Option(..., "--osl-tokens", help="Mean output tokens."),
    hit_rate: float = typer.Option(
        0.0, "--hit-rate", min=0.0, max=1.0, help="Prefix-cache hit rate of prompt tokens, 0..1."
    ),
    headroom: float = typer.Option(
        0.9, "--headroom", min=0.05, max=1.0, help="Fraction of a replica's capacity to plan on."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object on stdout instead of the table."
    ),
) -> None:
    """Replicas per pool and GPUs for a steady load, and which term binds each pool.

    Example: `pdorch plan --policy deploy/examples/slo-policy.yaml --rate-rps 20 --isl-tokens
    3000 --osl-tokens 300`
    """
    from rich.console import Console
    from rich.table import Table

    from autoscale.perf_model import build_perf_model
    from autoscale.policy import PolicyError, load_policy
    from autoscale.signals import Pool
    from autoscale.sizing import (
        UNREACHABLE,
        clamp_to_limits,
        context_tokens,
        decode_burst,
        decode_need,
        itl_target_s,
        prefill_need,
        replicas_for,
        ttft_target_s,
        uncached_tokens,
    )

    try:
        slo = load_policy(policy)
    except PolicyError as exc:
        sys.stderr.write(f"invalid policy: {exc}\n")
        raise typer.Exit(2) from None
    perf = build_perf_model(slo)
    ttft, itl = ttft_target_s(slo), itl_target_s(slo)
    need_p = prefill_need(perf, rate_rps, isl_tokens, hit_rate, ttft, headroom=headroom)
    t_own = perf.prefill_time_s(uncached_tokens(isl_tokens, hit_rate))
    need_d = decode_need(
        perf,
        rate_rps,
        isl_tokens,
        osl_tokens,
        itl,
        ttft_term_s=min(t_own, ttft),
        headroom=headroom,
        residence_at_step=slo.perf_model.decode_residence_at_batch_step,
        burst_dispersion=decode_burst(slo)[0],
        burst_q=decode_burst(slo)[1],
    )
    ctx = context_tokens(isl_tokens, osl_tokens)
    batch = perf.decode_max_batch(ctx, itl)
    kv_bound = batch >= min(perf.max_num_seqs, perf.kv_max_batch(ctx))
    terms = {
        Pool.PREFILL: "ttft-throughput",
        Pool.DECODE: "kv-capacity" if kv_bound and batch > 0 else "itl-batch",
    }
    pools: dict[str, dict[str, object]] = {}
    gpus = 0
    for pool, need in ((Pool.PREFILL, need_p), (Pool.DECODE, need_d)):
        raw = replicas_for(need)
        n, bound = clamp_to_limits(slo, pool, raw)
        per = slo.limits(pool).gpus_per_replica
        gpus += n * per
        pools[pool.value] = {
            "replicas": n,
            "need": None if math.isinf(need) or raw >= UNREACHABLE else round(need, 3),
            "binding": bound or terms[pool],
            "gpus": n * per,
            "unreachable": raw >= UNREACHABLE,
        }
    fits = slo.gpu_budget is None or gpus <= slo.gpu_budget
    out = {
        "load": {
            "rate_rps": rate_rps,
            "isl_tokens": isl_tokens,
            "osl_tokens": osl_tokens,
            "hit_rate": hit_rate,
        },
        "slo": {"ttft_s": ttft, "itl_s": itl},
        "headroom": headroom,
        "decode_batch_per_replica": batch,
        "pools": pools,
        "gpus": gpus,
        "gpu_budget": slo.gpu_budget,
        "fits_budget": fits,
    }
    if as_json:
        sys.stdout.write(json.dumps(out) + "\n")
    else:
        table = Table(title=f"plan: {rate_rps:g} req/s, ISL {isl_tokens:g}, OSL {osl_tokens:g}")
        for column in ("pool", "replicas", "need", "GPUs", "binding term"):
            table.add_column(column)
        for name, row in pools.items():
            table.add_row(
                name, str(row["replicas"]), str(row["need"]), str(row["gpus"]), str(row["binding"])
            )
        console = Console()
        console.print(table)
        budget = f" of a {slo.gpu_budget}-GPU budget" if slo.gpu_budget is not None else ""
        console.print(f"{gpus} GPUs{budget}" + ("" if fits else " [red]over budget[/red]"))
    if not fits:
        raise typer.Exit(1)
