"""`pdorch serve`: the OpenAI-compatible P/D endpoint over a fleet, in the foreground.

With no arguments it starts the embedded demo: four simulated engines (2 prefill + 2 decode,
Llama-3.1-8B on one H100 each, real time, the semantics of `deploy/examples/fleet-sim.yaml`)
in this process, and the coordinator on http://127.0.0.1:8000. The simulated engines tokenize
English words and answer in readable, deterministic sentences (`tokenizer: builtin:words`,
pools/sim/words.py; fleet-sim.yaml keeps the byte tokenizer), and the coordinator asks them
(`tokenizer: engine`), so its block keys are the engines' and any OpenAI client can use it at
once, with no model download. `--config FILE` serves the fleet in FILE instead (real vLLM
engines launched locally, existing endpoints, or sims).

It prints what it started (pools, replicas, URLs) and three commands to try
(`serve_banner.py`); Ctrl-C (or SIGTERM) stops everything it started. Several coordinators
over one fleet file: give each its own `--sync-bind` and all of them as `--sync-peer`
(deploy/examples/fleet-two-coordinators.md). Several coordinators on one host and port:
`--workers N` (`serve_workers.py`, design in `pdorch/app/workers.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from pdorch.cli.options import split_list
from pools.sim.words import WORDS_TOKENIZER

DEMO_MODEL = "llama-3.1-8b"


def demo_fleet() -> dict[str, Any]:
    """The embedded demo fleet (deploy/examples/fleet-sim.yaml with the words tokenizer)."""

    def sims() -> dict[str, Any]:
        return {
            "launch": [
                {
                    "kind": "sim",
                    "count": 2,
                    "model_profile": "llama-3.1-8b",
                    "gpu": "h100",
                    "tp": 1,
                    "time_scale": 1.0,
                    "kv_transport": "tcp",
                    # English words in, readable sentences out (pools/sim/words.py)
                    "tokenizer": WORDS_TOKENIZER,
                }
            ]
        }

    return {
        "served_model_name": DEMO_MODEL,
        "block_size": 16,
        "pools": {
            "prefill": {"policy": {"name": "token_load"}, **sims()},
            "decode": {
                "policy": {
                    "name": "token_load_decode",
                    "params": {"expected_output_tokens": 256},
                },
                **sims(),
            },
        },
        "pd": {"min_uncached_tokens": 512, "max_prefill_queue_s": 1.0},
        "tokenizer": {"mode": "engine"},
        "coordinator": {"host": "127.0.0.1", "port": 8000},
    }


def serve(
    host: str | None = typer.Option(
        None, help="Address to listen on (default: the fleet file's coordinator.host, 127.0.0.1)."
    ),
    port: int | None = typer.Option(
        None,
        help="Port to listen on (default: the fleet file's coordinator.port, 8000; 0: any free "
        "port, printed at start).",
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        help="Fleet YAML (pools, engines, policies; see deploy/examples/). Without it: the "
        "embedded demo of 2 prefill + 2 decode simulated engines.",
        exists=True,
        dir_okay=False,
        readable=True,
    ),
    sync_bind: str | None = typer.Option(
        None,
        "--sync-bind",
        metavar="ENDPOINT",
        help="Several coordinators over one fleet: the ZMQ endpoint this coordinator publishes "
        "its token-load deltas on (e.g. tcp://10.0.0.2:7300). Replaces the fleet file's "
        "sync.bind (creates the sync: section if missing), so one file serves every "
        "coordinator. See pdorch/SYNC.md. Default: the fleet file's sync.bind.",
    ),
    sync_peer: list[str] | None = typer.Option(
        None,
        "--sync-peer",
        metavar="ENDPOINT,...",
        help="Other coordinators' --sync-bind endpoints to follow, comma-separated or repeated "
        "(appended to sync.peers; this coordinator's own endpoint is skipped, so every process "
        "can be given the full list). Default: the fleet file's sync.peers.",
    ),
    slo_policy: Path | None = typer.Option(
        None,
        "--slo-policy",
        help="SLO policy YAML (deploy/examples/slo-policy.yaml): run the autoscaler in this "
        "process over the launched pools, within the policy's pool limits. Without it: no "
        "autoscaler (pools keep their size unless `pdorch scale set` changes them), except "
        "that a fleet file with `models:` runs one per model that sets its own `slo_policy` "
        "(this policy is then the default of the models that set none).",
        exists=True,
        dir_okay=False,
        readable=True,
    ),
    workers: int | None = typer.Option(
        None,
        min=1,
        max=64,
        help="Coordinator processes sharing the port (SO_REUSEPORT) and their token load; the "
        "engines start once. Above 1 the fleet is fixed: scale and drain answer 409, no "
        "--slo-policy (pdorch/app/workers.py). Default: the fleet file's coordinator.workers, 1.",
    ),
    log_level: str = typer.Option("warning", help="Log level (stderr): debug, info, warning."),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Once serving, print one JSON object line on stdout ({url, served_model_name, "
        "replicas: [{replica, pool, kind, url, kv_events_endpoint}]}) for scripts; the table "
        "and messages go to stderr.",
    ),
) -> None:
    """Serve the OpenAI API (completions, chat; stream or not) over a P/D fleet.

    The launched pools can be scaled while it serves (`pdorch scale status|set|auto|move`;
    the demo's simulated engines too), and `--slo-policy` runs the autoscaler in-process.

    Example: `pdorch serve` (the demo on http://127.0.0.1:8000), or
    `pdorch serve --config deploy/examples/fleet-vllm-cpu.yaml --port 8080`
    """
    import asyncio
    import json
    import logging
    import signal
    import sys

    from rich.console import Console

    from pdorch.cli.serve_banner import print_started, started_line
    from pdorch.config.fleet import FleetConfigError, load_fleet_config, parse_fleet_config
    from pools.launch_engines import FleetLaunchError

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr)
    err = Console(stderr=True)
    console = err if as_json else Console()
    try:
        fleet = (
            load_fleet_config(config)
            if config is not None
            else parse_fleet_config(demo_fleet(), source="embedded demo fleet")
        ).with_sync_overrides(sync_bind, split_list(sync_peer, "--sync-peer") if sync_peer else ())
    except FleetConfigError as exc:
        err.print(f"[red]invalid fleet config[/red]\n{exc}")
        raise typer.Exit(2) from None
    from autoscale.policy import PolicyError, load_policy

    try:
        policy = load_policy(slo_policy) if slo_policy is not None else None
    except PolicyError as exc:
        err.print(f"[red]invalid SLO policy[/red]\n{exc}")
        raise typer.Exit(2) from None
    n_workers = workers if workers is not None else fleet.coordinator.workers
    if n_workers > 1:
        _serve_workers(
            fleet, n_workers, host, port, config, slo_policy, console, as_json, log_level
        )
        return

    async def main() -> None:
        from pdorch.app.gc_tuning import tune_gc_for_serving
        from pdorch.app.server import run_coordinator

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        what = f"fleet {config}" if config is not None else "embedded demo fleet"
        with console.status(f"starting the {what} ..."):
            context = run_coordinator(fleet, host=host, port=port, slo_policy=policy)
            running = await context.__aenter__()
        tune_gc_for_serving()  # the start-up heap is never walked again (gc_tuning.py)
        from pdorch.autoscaler.in_process import model_control_loops, run_loops

        autoscaler: asyncio.Task[None] | None = None
        stop_loop = asyncio.Event()
        # one loop per model with an SLO policy (pdorch/autoscaler/in_process.py)
        loops = model_control_loops(running, policy)
        if loops:
            autoscaler = asyncio.ensure_future(run_loops(loops, stop_loop))
        try:
            if as_json:
                started = started_line(
                    running.url, fleet.served_model_name, fleet.model_names(), running.endpoints
                )
                sys.stdout.write(json.dumps(started) + "\n")
                sys.stdout.flush()
            print_started(
                console,
                what=what,
                url=running.url,
                models=fleet.model_names(),
                endpoints=running.endpoints,
                admin_token=running.coordinator.admin_token is not None,
            )
            sync = running.coordinator.sync
            if sync is not None:
                console.print(
                    f"sharing token load as {sync.origin!r} on {sync.endpoint} with "
                    f"{', '.join(sync.settings.peers) or 'no peers'}"
                )
            if autoscaler is not None:
                if len(running.models) > 1:
                    console.print(f"autoscaler: in-process, for {', '.join(loops)}")
                else:
                    console.print(f"autoscaler: in-process, policy {slo_policy}")
            console.print("Ctrl-C stops the coordinator and every engine it started.")
            await stop.wait()
            console.print("stopping ...")
        finally:
            stop_loop.set()
            if autoscaler is not None:
                await autoscaler
            await context.__aexit__(None, None, None)

    try:
        run: Any = asyncio.run
        try:
            import uvloop  # the faster loop when installed (it is, with uvicorn[standard])

            run = uvloop.run
        except ImportError:
            pass
        run(main())
    except FleetLaunchError as exc:
        err.print(f"[red]an engine did not start[/red]: {exc}")
        raise typer.Exit(1) from None
    except OSError as exc:
        err.print(f"[red]cannot serve[/red]: {exc}")
        raise typer.Exit(1) from None


def _serve_workers(
    fleet: Any,
    n_workers: int,
    host: str | None,
    port: int | None,
    config: Path | None,
    slo_policy: Path | None,
    console: Any,
    as_json: bool,
    log_level: str,
) -> None:
    """`--workers N` with N > 1: refuse what workers cannot serve (exit 2), else supervise."""
    import asyncio

    from rich.console import Console

    from pdorch.app.workers import WorkerStartError, refusal
    from pdorch.cli.serve_workers import serve_workers
    from pools.launch_engines import FleetLaunchError

    err = Console(stderr=True)
    why = refusal(fleet, slo_policy=slo_policy is not None)
    if why is not None:
        err.print(f"[red]--workers {n_workers}[/red]: {why}")
        raise typer.Exit(2)
    what = f"fleet {config}" if config is not None else "embedded demo fleet"
    run: Any = asyncio.run
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        pass
    try:
        run(
            serve_workers(
                fleet,
                workers=n_workers,
                host=host,
                port=port,
                what=what,
                console=console,
                as_json=as_json,
                log_level=log_level,
            )
        )
    except FleetLaunchError as exc:
        err.print(f"[red]an engine did not start[/red]: {exc}")
        raise typer.Exit(1) from None
    except WorkerStartError as exc:
        err.print(f"[red]a coordinator worker did not start[/red]: {exc}")
        raise typer.Exit(1) from None
    except OSError as exc:
        err.print(f"[red]cannot serve[/red]: {exc}")
        raise typer.Exit(1) from None
