"""`pdorch bench router`: routing decision latency (p50/p99) and KV-event ingestion (blocks/s).

What is measured is documented in `benchmarks/router_bench.py`. The progress bar goes to stderr;
the report is a rich table (stdout, or stderr with `--json`); `--json` prints exactly one JSON
object on stdout: `{"decision": [{"prompt_tokens", "replicas", "p50_us", "p99_us", ...}, ...],
"ingest_blocks_per_s": ..., "targets_met": {...}}`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from pdorch.cli.options import split_ints

RENAMED = {"--output": "--out"}
"""Old flag spellings, accepted as hidden aliases for one release (pdorch/cli/options.py)."""


def bench_router(
    prompt_tokens_list: list[str] = typer.Option(
        ["1024,8192,32768"],
        "--prompt-tokens",
        metavar="N,...",
        help="Prompt length(s) in tokens to time decisions for; comma-separated or repeated.",
    ),
    replicas_list: list[str] = typer.Option(
        ["8,64,256"],
        "--replicas",
        metavar="N,...",
        help="Candidate replica count(s), each with a populated KV index; comma-separated or "
        "repeated.",
    ),
    iterations: int = typer.Option(
        300, min=1, help="Timed decisions per (prompt tokens, replicas) pair; p99 needs >= 100."
    ),
    ingest_blocks: int = typer.Option(
        200_000,
        min=0,
        help="KV blocks of vLLM-format events to decode and index for the ingestion rate "
        "(0 skips it).",
    ),
    block_size: int = typer.Option(16, min=1, help="Tokens per KV block (vLLM --block-size)."),
    seed: int = typer.Option(0, help="Seed of the synthetic prompts, index and event stream."),
    policy: str = typer.Option(
        "token_load",
        "--policy",
        help="Prefill profile to time, in `pdorch bench sim --policies` syntax (e.g. "
        "token_load@remaining_decode=true).",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="File to also write the JSON object to (e.g. benchmarks/results/router.json). "
        "Default: write no file.",
        dir_okay=False,
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object on stdout; table and progress on stderr."
    ),
) -> None:
    """Time the router: block-key hashing + KV index match + token-load pick, and ingestion.

    Example: `pdorch bench router --prompt-tokens 1024,8192 --replicas 8,64 --json`
    """
    prompt_tokens = split_ints(prompt_tokens_list, "--prompt-tokens")
    replicas = split_ints(replicas_list, "--replicas")
    from benchmarks.fleet_sim.policies import router_config_for
    from router.policies.config import build_policy

    try:  # a bad name or param fails here, naming the flag, not after the index is built
        build_policy(router_config_for(policy).prefill, field_prefix="prefill")
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--policy") from None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.table import Table

    from benchmarks.router_bench import (
        TARGET_INGEST_BLOCKS_PER_S,
        TARGET_P99_US,
        TARGET_PROMPT_TOKENS,
        TARGET_REPLICAS,
        run_router_bench,
    )

    err = Console(stderr=True)
    total = len(prompt_tokens) * len(replicas) * iterations + (1 if ingest_blocks else 0)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task("router bench", total=total)

        def progress(stage: str, done: int) -> None:
            bar.update(task, description=stage, advance=done)

        result = run_router_bench(
            prompt_tokens=prompt_tokens,
            replicas=replicas,
            iterations=iterations,
            ingest_blocks=ingest_blocks,
            block_size=block_size,
            seed=seed,
            progress=progress,
            policy=policy,
        )

    table = Table(
        title=f"pdorch bench router (block size {block_size}, {iterations} decisions each)"
    )
    columns = (
        "tokens",
        "replicas",
        "p50 µs",
        "p99 µs",
        "mean µs",
        "cpu p50 µs",
        "cpu p99 µs",
        "index B/entry",
    )
    for column in (*columns, "target"):
        table.add_column(column, justify="right")
    for d in result.decision:
        target = ""
        if d.prompt_tokens == TARGET_PROMPT_TOKENS and d.replicas == TARGET_REPLICAS:
            target = "met" if d.p99_us <= TARGET_P99_US else "MISSED"
        table.add_row(
            str(d.prompt_tokens),
            str(d.replicas),
            f"{d.p50_us:.0f}",
            f"{d.p99_us:.0f}",
            f"{d.mean_us:.0f}",
            f"{d.cpu_p50_us:.0f}",
            f"{d.cpu_p99_us:.0f}",
            f"{d.index_bytes_per_entry:.0f}",
            target,
        )
    caption = [
        f"target: p99 <= {TARGET_P99_US:.0f} µs at {TARGET_PROMPT_TOKENS} tokens x "
        f"{TARGET_REPLICAS} replicas"
    ]
    if result.ingest_blocks:
        ok = result.ingest_blocks_per_s >= TARGET_INGEST_BLOCKS_PER_S
        caption.append(
            f"ingestion: {result.ingest_blocks_per_s:,.0f} blocks/s "
            f"({result.ingest_blocks:,} blocks); target >= {TARGET_INGEST_BLOCKS_PER_S:,.0f}: "
            f"{'met' if ok else 'MISSED'}"
        )
    table.caption = "\n".join(caption)
    data = result.to_json()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=2) + "\n")
    if as_json:
        err.print(table)
        sys.stdout.write(json.dumps(data) + "\n")
    else:
        Console().print(table)
