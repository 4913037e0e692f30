"""`pdorch bench proxy`: P/D req/s and added latency through pdorch vs vllm-router vs direct.

What is measured is documented in `benchmarks/proxy_bench.py`. Progress goes to stderr; the
report is a rich table (stdout, or stderr with `--json`); `--json` prints exactly one JSON
object on stdout: `{"rows": [{"target": "pdorch|vllm-router|direct", "concurrency": C,
"rps": X, "rps_rounds": [...], "p50_ms": Y, "p99_ms": Z, "added_p50_ms",
"rps_vs_vllm_router", ...}, ...], "skipped": {target: why}, "config": {...}}`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from pdorch.cli.options import split_ints, split_list

RENAMED = {"--output": "--out"}
"""Old flag spellings, accepted as hidden aliases for one release (pdorch/cli/options.py)."""


def bench_proxy(
    requests: int = typer.Option(
        2000, min=1, help="Timed requests per (target, concurrency); p99 needs >= 100."
    ),
    concurrency: list[str] = typer.Option(
        ["1,32"],
        metavar="N,...",
        help="Concurrent clients, comma-separated or repeated, e.g. 1,32 (each on its own "
        "connection).",
    ),
    targets: list[str] = typer.Option(
        ["direct,vllm-router,pdorch"],
        metavar="NAME,...",
        help="Targets, comma-separated or repeated: direct (the client does both legs, no proxy), "
        "vllm-router (--vllm-pd-disaggregation), pdorch (pdorch serve), pdorch-aiohttp / "
        "pdorch-native (pdorch serve with coordinator.leg_client pinned; not in the default "
        "list). A target that cannot "
        "start is listed under `skipped`.",
    ),
    max_tokens: int = typer.Option(4, min=1, help="Output tokens per request (decode leg)."),
    warmup: int = typer.Option(
        50, min=0, help="Untimed requests before each (target, concurrency) run."
    ),
    time_scale: float = typer.Option(
        0.0001,
        min=0.0,
        help="Engines' real seconds per simulated second: tiny = engines answer almost at "
        "once, so the proxy is the bottleneck.",
    ),
    model_profile: str = typer.Option(
        "tiny", help="Simulated engines' model profile (timing model; see `pdorch profile`)."
    ),
    log_dir: Path | None = typer.Option(
        None, help="Where engine/proxy logs go (default: a new temp directory)."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="File to also write the JSON object to (e.g. benchmarks/results/proxy.json). "
        "Default: write no file.",
        dir_okay=False,
    ),
    stream: bool = typer.Option(
        False,
        "--stream",
        help="Streamed answers (SSE, `stream: true`): every answer must end with [DONE] after "
        "max_tokens token events. Use e.g. --max-tokens 256 for long streams.",
    ),
    py_spy_dir: Path | None = typer.Option(
        None,
        help="Record a py-spy flame graph of pdorch per concurrency into this directory "
        "(TARGET-{whole,stream}-cN.svg per pdorch target; needs py-spy and ptrace rights). "
        "Default: no profile.",
        file_okay=False,
    ),
    workers: list[str] = typer.Option(
        ["1"],
        metavar="N,...",
        help="`pdorch serve --workers N` per value, comma-separated or repeated (e.g. 1,2): "
        "target pdorch for 1, pdorch-wN for N > 1, side by side in one run; CPU per request "
        "counts the supervisor and every worker. Default: 1 (one coordinator process).",
    ),
    rounds: int = typer.Option(
        1,
        min=1,
        help="Interleaved rounds per concurrency: each target's timed requests split into this "
        "many rounds, the targets in turn per round (a load swing hits all alike); rows sum "
        "their rounds and list each round's req/s (rps_rounds). Default: 1 (each target once).",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object on stdout; table and progress on stderr."
    ),
) -> None:
    """Compare P/D proxies on the same two simulated engines (separate processes, one run).

    Example: `pdorch bench proxy --requests 2000 --concurrency 1,32 --json --out proxy.json`
    """
    import asyncio

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.table import Table

    from benchmarks.proxy_bench import TARGETS, ProxyBenchConfig, run_proxy_bench

    levels = tuple(split_ints(concurrency, "--concurrency"))
    if any(c < 1 for c in levels):
        raise typer.BadParameter("--concurrency: every value must be >= 1")
    chosen = tuple(split_list(targets, "--targets"))
    unknown = [t for t in chosen if t not in TARGETS]
    if unknown:
        raise typer.BadParameter(f"--targets: unknown {unknown}; choose from {list(TARGETS)}")
    worker_counts = tuple(split_ints(workers, "--workers"))
    if any(n < 1 for n in worker_counts):
        raise typer.BadParameter("--workers: every value must be >= 1")
    config = ProxyBenchConfig(
        requests=requests,
        concurrency=levels,
        targets=chosen,
        max_tokens=max_tokens,
        warmup=warmup,
        time_scale=time_scale,
        model_profile=model_profile,
        log_dir=log_dir,
        stream=stream,
        py_spy_dir=py_spy_dir,
        workers=worker_counts,
        rounds=rounds,
    )

    err = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
    ) as bar:
        runs = len(chosen) + (len(worker_counts) - 1 if "pdorch" in chosen else 0)
        task = bar.add_task("starting", total=requests * len(levels) * runs)
        result = asyncio.run(
            run_proxy_bench(
                config,
                on_progress=lambda: bar.advance(task),
                on_status=lambda msg: bar.update(task, description=msg),
            )
        )

    table = Table(
        title=f"pdorch bench proxy ({requests} requests each, max_tokens {max_tokens}, "
        f"{'streamed' if stream else 'whole answers'}, "
        f"engines at time scale {time_scale})"
    )
    columns = ("target", "C", "ok", "err", "req/s", "p50 ms", "p99 ms", "+p50 ms", "+p99 ms")
    for column in (*columns, "proxy CPU µs/req", "req/s vs vllm-router"):
        table.add_column(column, justify="right")
    for row in result["rows"]:

        def fmt(value: object, spec: str = ".2f") -> str:
            return "-" if value is None else format(value, spec)

        table.add_row(
            row["target"],
            str(row["concurrency"]),
            str(row["ok"]),
            str(row["errors"]),
            fmt(row["rps"], ".0f"),
            fmt(row["p50_ms"]),
            fmt(row["p99_ms"]),
            fmt(row["added_p50_ms"]),
            fmt(row["added_p99_ms"]),
            fmt(row["proxy_cpu_us_per_req"], ".0f"),
            fmt(row["rps_vs_vllm_router"]),
        )
    for name, why in result["skipped"].items():
        table.caption = (table.caption or "") + f"skipped {name}: {why.splitlines()[0]}\n"
    Console(stderr=as_json, width=160).print(table)
    for row in result["rows"]:
        if row["first_error"]:
            err.print(f"[red]{row['target']} C={row['concurrency']}: {row['first_error']}")

    text = json.dumps(result, indent=2)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    if as_json:
        sys.stdout.write(text + "\n")
