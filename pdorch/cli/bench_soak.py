"""`pdorch bench soak`: hours-long steadiness of the coordinator under load (issue 14 part 5).

A simulated 2P+2D fleet (four `pdorch engine sim` processes on fixed ports, behind `pdorch
serve`) under a moderate steady load (8 clients, half streaming), one engine restarted every
`--restart-every-s` (rotating prefill-0, decode-0, prefill-1, decode-1; SIGTERM and kill -9 in
turn), and every `--sample-s` a sample of the coordinator: RSS, open fds, sockets, connections
to the engines, KV leases held by the prefill engines, KV index size, token load, requests ok /
failed. Reported: each series' least-squares slope per hour after `--warmup-s`, against a
tolerance (`benchmarks/soak/trend.py`), the verdict flat / not flat, a table, and with `--out`
`soak.json` + `soak.png` (the plot). `--json` prints exactly one JSON object on stdout:
`{"trend": {"flat", "not_flat", "metrics": {name: {"slope_per_h", "tolerance_per_h", "flat",
...}}}, "samples": [...], "restarts": [...], "after": {...}, "requests": {...}, "config"}`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import typer

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")
_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """`30m`, `90s`, `1.5h` or a bare number of seconds, as seconds; ValueError otherwise."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration like 30m, 90s, 1h")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def bench_soak(
    duration: str = typer.Option(
        "30m", help="How long the load runs: 30m, 90s, 1h, or a bare number of seconds."
    ),
    restart_every_s: float = typer.Option(
        180.0, min=1.0, help="Seconds between engine restarts (one engine each time, in turn)."
    ),
    sample_s: float = typer.Option(10.0, min=0.1, help="Seconds between samples."),
    warmup_s: float = typer.Option(
        600.0,
        min=0.0,
        help="Seconds at the start left out of the slopes: pools open, the KV index and the "
        "coordinator's bounded caches fill (the tokenize LRU of 4096 prompts took 9 minutes at "
        "8 clients).",
    ),
    concurrency: int = typer.Option(
        8, min=2, help="Concurrent clients (even ones stream, odd ones do not)."
    ),
    max_tokens: int = typer.Option(128, min=1, help="Output tokens per request."),
    time_scale: float = typer.Option(
        1.0, min=0.0, help="Engines' real seconds per simulated second (1.0 = real time)."
    ),
    log_dir: Path | None = typer.Option(
        None,
        help="Where engine and coordinator logs go (default: a temporary directory, removed "
        "at the end).",
        file_okay=False,
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Directory to write soak.json (the JSON object) and soak.png (the plot) to. "
        "Default: write no file.",
        file_okay=False,
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object on stdout; table and progress on stderr."
    ),
) -> None:
    """Run a P/D fleet for a long time with engine restarts; check the coordinator stays flat.

    Example: `pdorch bench soak --duration 30m --out benchmarks/results/soak --json`
    """
    import asyncio

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from benchmarks.chaos.fleet import FleetSettings
    from benchmarks.chaos.load import LoadSettings
    from benchmarks.soak.plot import write_plot
    from benchmarks.soak.runner import SoakConfig, run_soak

    try:
        duration_s = parse_duration(duration)
    except ValueError as bad:
        raise typer.BadParameter(str(bad), param_hint="--duration") from None
    config = SoakConfig(
        duration_s=duration_s,
        restart_every_s=restart_every_s,
        sample_s=sample_s,
        warmup_s=warmup_s,
        load=LoadSettings(concurrency=concurrency, max_tokens=max_tokens),
        fleet=FleetSettings(time_scale=time_scale, num_blocks=2048),
        log_dir=log_dir,
    )
    err = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[line]}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task("starting", total=duration_s, line="")

        def on_sample(s: dict[str, object]) -> None:
            line = f"rss {s['rss_mib']} MiB, fds {s['open_fds']}, ok {s['requests_ok']}"
            bar.update(task, completed=float(str(s["t_s"])), line=line)

        result = asyncio.run(
            run_soak(
                config,
                on_sample=on_sample,
                on_status=lambda msg: bar.update(task, description=msg),
            )
        )

    trend = result["trend"]
    table = Table(
        title=f"pdorch bench soak ({duration}, {concurrency} clients, restart every "
        f"{restart_every_s:g}s; slopes after {warmup_s:g}s): "
        + ("flat" if trend["flat"] else "NOT flat: " + ", ".join(trend["not_flat"]))
    )
    for column in ("metric", "first", "median", "max", "last", "after", "slope/h", "tolerance/h"):
        table.add_column(column, justify="right")
    table.add_column("verdict")
    after = result["after"]
    for name, row in trend["metrics"].items():
        slope = row["slope_per_h"]
        table.add_row(
            name,
            *(_num(row[k]) for k in ("first", "median", "max", "last")),
            _num(after.get(name)),
            "n/a" if slope is None else f"{slope:+.2f} {row['unit']}",
            f"{row['tolerance_per_h']:g}",
            ("flat" if row["flat"] else "NOT flat") if row["decides"] else "(info)",
        )
    Console(stderr=as_json, width=160).print(table)
    req = result["requests"]
    err.print(
        f"requests: {req['sent']} sent, {req['succeeded']} ok, "
        f"{req['failed_before_first_byte']} failed before the first byte, "
        f"{req['broken_mid_stream']} broken mid-stream, {req['hung']} hung; "
        f"{len(result['restarts'])} restarts; token load 0 after: {after['token_load_zero']}"
    )
    for message in req["errors"]:
        err.print(f"[red]{message}")

    text = json.dumps(result, indent=2)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "soak.json").write_text(text + "\n")
        write_plot(result, out / "soak.png")
    if as_json:
        sys.stdout.write(text + "\n")


def _num(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)
