"""`pdorch bench live`: drive a running OpenAI-compatible endpoint with a workload, in real time.

The load generator lives in `benchmarks/live/` (timing rules in `client.py`, scheduling in
`runner.py`, metric names in `summary.py`, the same names `pdorch bench sim` reports). Progress
goes to stderr; the report is a rich table; `--json` prints exactly one JSON object on stdout.
Only loopback URLs are accepted unless `--allow-remote` is given.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

RENAMED = {
    "--model": "--served-model-name",
    "--duration": "--duration-s",
    "--request-timeout": "--request-timeout-s",
}
"""Old flag spellings, accepted as hidden aliases for one release (pdorch/cli/options.py)."""


def _parse_params(items: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--param")
        try:
            params[key.strip().replace("-", "_")] = json.loads(raw)
        except json.JSONDecodeError:
            params[key.strip().replace("-", "_")] = raw
    return params


def bench_live(
    url: str = typer.Option(
        ...,
        "--url",
        help="Base URL of the OpenAI-compatible server (coordinator, vLLM, simulated engine), "
        "e.g. http://127.0.0.1:8000; `/v1` is added when missing.",
    ),
    workload: str | None = typer.Option(
        None,
        "--workload",
        help="Synthetic workload: rl-rollouts, agentic or shared-prefix (see "
        "benchmarks/workloads/API.md). Give this or --trace.",
    ),
    trace: Path | None = typer.Option(
        None, "--trace", help="Replay a trace file (Mooncake JSONL or Azure CSV) instead."
    ),
    trace_format: str | None = typer.Option(
        None,
        "--trace-format",
        help="mooncake | azure; default: detected from the extension/content.",
    ),
    rate_scale: float = typer.Option(
        1.0,
        "--rate-scale",
        help="Compress time: open-loop arrivals happen at start/X (2.0 = twice the rate).",
    ),
    concurrency: int | None = typer.Option(
        None,
        "--concurrency",
        min=1,
        help="Cap on concurrently active sessions (overrides the workload's closed-loop cap; "
        "open-loop arrivals wait for a slot). Default: the workload's.",
    ),
    duration_s: float | None = typer.Option(
        None,
        "--duration-s",
        help="Stop after this many seconds: no new requests, in-flight ones are cancelled. "
        "Default: run the whole workload.",
    ),
    max_requests: int | None = typer.Option(
        None,
        "--max-requests",
        min=1,
        help="Start at most this many requests, then drain. Default: all of the workload's.",
    ),
    served_model_name: str | None = typer.Option(
        None,
        "--served-model-name",
        help="Served model name to put in each request (default: the first of GET /v1/models).",
    ),
    api: str = typer.Option(
        "chat", "--api", help="chat (/v1/chat/completions, multi-turn messages) | completions."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the synthetic workload."),
    param: list[str] = typer.Option(
        [],
        "--param",
        help="Workload parameter KEY=VALUE (JSON value), repeated for several (never split at "
        "commas), e.g. --param steps=2 --param sessions=20; for traces: spread_buckets=true.",
    ),
    request_timeout_s: float = typer.Option(
        600.0, "--request-timeout-s", help="Seconds a request may take before it counts as failed."
    ),
    ignore_eos: bool = typer.Option(
        True,
        "--ignore-eos/--no-ignore-eos",
        help="Send vLLM's ignore_eos so each request generates exactly its output length "
        "(turn off for servers that reject unknown fields).",
    ),
    allow_remote: bool = typer.Option(
        False,
        "--allow-remote",
        help="Allow a non-loopback --url. Only load endpoints you own and may stress.",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Directory (created) to write results.json (the summary) and requests.jsonl (one "
        "line per request) into. Default: write no files.",
        file_okay=False,
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object on stdout; table and progress on stderr."
    ),
) -> None:
    """Measure TTFT, ITL, TPOT and throughput of an OpenAI endpoint under a workload.

    Example: `pdorch bench live --url http://127.0.0.1:8000 --workload agentic --duration-s 60
    --json --out out/`
    """
    import asyncio

    import httpx
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from benchmarks.live.client import RequestResult
    from benchmarks.live.runner import LiveConfig, run_workload
    from benchmarks.live.summary import summarize
    from benchmarks.live.url_guard import check_target_url
    from benchmarks.workloads import load_workload

    err = Console(stderr=True)
    if (workload is None) == (trace is None):
        raise typer.BadParameter("give exactly one of --workload NAME or --trace PATH")
    for name, value in (
        ("--rate-scale", rate_scale),
        ("--duration-s", duration_s),
        ("--request-timeout-s", request_timeout_s),
    ):
        if value is not None and value <= 0:
            raise typer.BadParameter(f"must be > 0, got {value}", param_hint=name)
    if api not in ("chat", "completions"):
        raise typer.BadParameter("must be chat or completions", param_hint="--api")
    try:
        base_url = check_target_url(url, allow_remote=allow_remote)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--url") from None
    params = _parse_params(param)
    try:
        if trace is not None:
            wl = load_workload(
                trace, trace_format=trace_format, rate_scale=rate_scale, seed=seed, **params
            )
        else:
            assert workload is not None
            wl = load_workload(workload, rate_scale=rate_scale, seed=seed, **params)
    except (ValueError, TypeError, FileNotFoundError) as e:
        err.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None

    model = served_model_name
    if model is None:
        try:
            model = _first_model(httpx, base_url)
        except Exception as e:  # any failure to list models is reported the same way
            err.print(
                f"[red]error:[/red] cannot list models at {base_url}: {e}; pass --served-model-name"
            )
            raise typer.Exit(2) from None

    cfg = LiveConfig(
        base_url=base_url,
        model=model,
        api="chat" if api == "chat" else "completions",
        concurrency=concurrency,
        duration_s=duration_s,
        max_requests=max_requests,
        request_timeout_s=request_timeout_s,
        ignore_eos=ignore_eos,
    )
    total = wl.num_requests if max_requests is None else min(wl.num_requests, max_requests)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("errors {task.fields[errors]}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(f"bench live {wl.name}", total=total, errors=0)
        n_errors = 0

        def on_result(r: RequestResult) -> None:
            nonlocal n_errors
            if r.error is not None and not r.cancelled:
                n_errors += 1
            bar.update(task, advance=1, errors=n_errors)

        run = asyncio.run(run_workload(wl, cfg, on_result=on_result))

    summary = summarize(run, wl)
    summary.update({"url": base_url, "model": model, "api": api, "seed": seed})
    summary["workload_meta"] = wl.meta

    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        with (out / "requests.jsonl").open("w") as f:
            for r in run.results:
                f.write(json.dumps(_request_row(r)) + "\n")

    table = _table(Table, summary)
    if as_json:
        err.print(table)
        sys.stdout.write(json.dumps(summary, default=str) + "\n")
    else:
        Console().print(table)
    if summary["completed"] == 0 and run.planned_requests > 0:
        raise typer.Exit(1)


def _first_model(httpx: Any, base_url: str) -> str:
    base = base_url if base_url.endswith("/v1") else base_url + "/v1"
    with httpx.Client(trust_env=False, timeout=10.0) as c:
        r = c.get(f"{base}/models")
        r.raise_for_status()
        data = r.json()["data"]
        return str(data[0]["id"])


def _request_row(r: Any) -> dict[str, Any]:
    return {
        "session_id": r.session_id,
        "turn": r.turn,
        "group": r.group,
        "start_s": r.start_s,
        "end_s": r.end_s,
        "ttft_s": r.ttft_s,
        "itl_s": r.itl_s,
        "output_tokens": r.output_tokens,
        "prompt_tokens": r.prompt_tokens,
        "error": r.error,
        "cancelled": r.cancelled,
    }


def _table(table_cls: Any, s: dict[str, Any]) -> Any:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f}"

    t = table_cls(title=f"pdorch bench live: {s['workload']} @ {s['url']} ({s['model']})")
    for col in ("metric", "p50", "p90", "p99"):
        t.add_column(col, justify="right")
    for name in ("ttft", "itl", "tpot", "e2e"):
        t.add_row(
            f"{name.upper()} ms",
            ms(s[f"{name}_p50_ms"]),
            ms(s[f"{name}_p90_ms"]),
            ms(s[f"{name}_p99_ms"]),
        )
    caption = [
        f"completed {s['completed']}/{s['planned']}, errors {s['errors']}, "
        f"cancelled {s['cancelled']}, wall {s['wall_s']:.1f} s",
        f"{s['requests_per_s']:.2f} req/s, {s['output_tokens_per_s']:,.0f} output tok/s",
    ]
    if s.get("rollouts_planned"):
        p99 = s.get("rollout_p99_s")
        caption.append(
            f"rollouts {s['rollouts_completed']}/{s['rollouts_planned']}, rollout p99 "
            + ("-" if p99 is None else f"{p99:.2f} s")
        )
    if s["error_samples"]:
        caption.append("errors: " + " | ".join(s["error_samples"]))
    t.caption = "\n".join(caption)
    return t
