"""`pdorch bench autoscale`: planners side by side on a simulated P/D fleet (virtual time).

Every planner sees the same arrivals (one `Workload`) and drives its own dynamic fleet in the
fleet simulator (`benchmarks/autoscale_sim`): replicas join after the policy's `startup_s`,
leave after a drain, switch role after `switch_s`. The table (stdout, or stderr with
`--json`) and `--json` (one object on stdout: `{"planners": {NAME: {"attainment",
"gpu_hours", "lost", "direction_changes": {"prefill", "decode"},
"direction_changes_worst_10min": {"prefill", "decode"}, ...}}, "wall_s"}`; the worst 10 minutes:
the most direction changes in any 600 s window, `benchmarks/autoscale_sim/flaps.py`) summarise
each run; `--out DIR` writes `results.json` (every run's accounting, the exact command and
the settings), `policy.yaml` (the policy as the run read it, every default written out: pass
it as `--policy` to rerun after a default changed) and the report
(`benchmarks/autoscale_sim/report.py`). `--jobs N` runs the
planners in N forked worker processes (`benchmarks/autoscale_sim/parallel.py`; the same
results). `--merge DIR,...` simulates nothing: it makes one run, one `results.json` and one
report of several runs' folders of the same settings (`benchmarks/autoscale_sim/merge.py`).

`--live` runs one planner on a live fleet, time-compressed by `--time-scale`, and its what-if
beside it (`bench_autoscale_live.py`, `benchmarks/autoscale_live/README.md`).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import typer

from pdorch.cli.bench_autoscale_output import emit
from pdorch.cli.options import split_list

RENAMED: dict[str, str] = {}
"""Old flag spellings, accepted as hidden aliases for one release (pdorch/cli/options.py)."""

DEFAULT_PLANNERS = (
    "pdorch,oracle,static-peak,static-mean,hpa-kv-util,dynamo-planner,llmd-slo,aibrix-kpa"
)
DEFAULT_POLICY = Path("deploy/examples/slo-policy.yaml")
DEFAULT_LIVE_POLICY = Path("deploy/examples/slo-policy-live.yaml")
DEFAULT_LIVE_FLEET = "1P1D"
DEFAULT_TIME_SCALE = 0.2


def bench_autoscale(
    workload: str | None = typer.Option(
        None,
        "--workload",
        help="Named workload (e.g. diurnal, agentic, rl-rollouts). Exclusive with --trace.",
    ),
    trace: Path | None = typer.Option(
        None, "--trace", help="Trace file to replay (Mooncake JSONL or Azure CSV) instead."
    ),
    trace_format: str | None = typer.Option(
        None, "--trace-format", help="mooncake | azure; default: detected from the file."
    ),
    policy_file: Path | None = typer.Option(
        None,
        "--policy",
        help="SLO policy YAML (targets, pool limits, startup/drain/switch times, predictor; "
        f"autoscale/README.md). Default: {DEFAULT_POLICY} ({DEFAULT_LIVE_POLICY} with --live).",
    ),
    planners: list[str] = typer.Option(
        [],
        "--planners",
        metavar="NAME,...",
        help="Planners, comma-separated or repeated; NAME+role-switching runs NAME with role "
        "switching on (pdorch+role-switching-bridge: only to bridge a shortage now), beside "
        f"NAME without it. Default: {DEFAULT_PLANNERS} (with --live: pdorch, and exactly one).",
    ),
    live: bool = typer.Option(
        False,
        "--live",
        help="Run the workload against a live fleet (a pdorch coordinator, `pdorch engine "
        "sim` processes started and stopped by the local actuator, the in-process control "
        "loop, the live load client), time-compressed by --time-scale, then the what-if of "
        "the same workload, policy and planner, and report both side by side "
        "(benchmarks/autoscale_live/README.md). Keep it to a few hundred requests.",
    ),
    time_scale: float = typer.Option(
        DEFAULT_TIME_SCALE,
        "--time-scale",
        min=0.001,
        max=1.0,
        help="With --live: real seconds per virtual second (the engines' --time-scale; 0.2 = "
        "engines 5x faster than the GPU, arrivals 5x denser, the policy's loop period, drain "
        "bound and cold start 5x shorter).",
    ),
    rate_scale: float = typer.Option(
        1.0, "--rate-scale", min=0.0001, help="Arrival-rate multiplier (2 = twice the load)."
    ),
    rate_mode: str = typer.Option(
        "overlay",
        "--rate-mode",
        help="How a trace's --rate-scale is applied: overlay = k time-aligned copies of each "
        "request (the trace keeps its length and per-minute shape; "
        "benchmarks/workloads/overlay.py), compress = arrival times divided by k (the trace "
        "gets k times shorter; pdorch bench sim's behaviour). Named workloads scale their own "
        "rate.",
    ),
    max_requests: int | None = typer.Option(
        None, "--max-requests", min=1, help="Replay only the first N trace rows. Default: all."
    ),
    role_switching: bool | None = typer.Option(
        None,
        "--role-switching/--no-role-switching",
        help="Let replicas move between the pools (vLLM kv_both). Default: the policy's "
        "role_switching.",
    ),
    initial_fleet: str | None = typer.Option(
        None,
        "--initial-fleet",
        help="Fleet at t=0 for every planner, like 2P2D. Default: what the oracle sizes for "
        "the first 30 s (static planners start at their own fixed fleet); with --live "
        f"{DEFAULT_LIVE_FLEET}.",
    ),
    router_policy: str = typer.Option(
        "token_load",
        "--router-policy",
        help="Routing policy of the simulated coordinator (see pdorch bench sim --policies).",
    ),
    block_size: int = typer.Option(
        64,
        "--block-size",
        min=1,
        help="KV block size of the simulated engines. Mooncake traces identify 512-token "
        "blocks, so --block-size 512 gives the same hits 8x cheaper.",
    ),
    record_s: float = typer.Option(
        10.0, "--record-s", min=0.5, help="Timeline sample period, seconds (a multiple of 0.5)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the workload and seeded policies."),
    param: list[str] = typer.Option(
        [],
        "--param",
        help="Workload parameter KEY=VALUE (JSON value), repeated for several (never split at "
        "commas), e.g. --param peak_rps=12.",
    ),
    fast_forward: bool = typer.Option(
        True,
        "--fast-forward/--no-fast-forward",
        help="Advance pure-decode steps in bulk (same results, much faster).",
    ),
    jobs: int = typer.Option(
        1,
        "--jobs",
        min=1,
        help="Worker processes: the planners run N at a time over the same arrivals, one "
        "planner per process (fork); results.json, the report and --json are the same as "
        "with 1 (only the run's own timings differ). Each worker holds a copy of the "
        "workload's state: memory grows with N. Not with --live.",
    ),
    merge: list[str] = typer.Option(
        [],
        "--merge",
        metavar="DIR,...",
        help="Instead of simulating: make ONE run of these `bench autoscale --out` folders' "
        "results.json (comma-separated or repeated), e.g. one planner per folder run in "
        "parallel. Their settings must agree in everything but the planners (else the "
        "error names what differs); --planners then selects and orders the rows (default: "
        "every planner, pdorch, oracle, static-peak, ... first). The report lists each "
        "folder's own command. The run options (--policy, --rate-scale, --param, ...) are "
        "not used. Exclusive with --workload, --trace and --live.",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object on stdout; table and progress on stderr."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Directory (created) to write results.json, policy.yaml (the effective policy, "
        "every default written out: rerun with --policy DIR/policy.yaml), report.md and "
        "PNG plots into. "
        "Default: write no files.",
        file_okay=False,
    ),
) -> None:
    """Compare autoscaling planners on a simulated P/D fleet against an SLO policy; with
    --live, run one planner on a live fleet beside its virtual-time what-if.

    Several folders of one workload (say one per planner, run in parallel) become one run
    and one report with --merge.

    Example: `pdorch bench autoscale --trace benchmarks/traces/azure/AzureLLMInferenceTrace_conv.csv
    --trace-format azure --planners pdorch,oracle,static-peak --jobs 3 --json --out out/`
    """
    import time

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from autoscale.planners import planner_names
    from autoscale.policy import PolicyError, load_policy
    from autoscale.signals import Pool
    from benchmarks.autoscale_sim.parallel import PlannerPool
    from benchmarks.autoscale_sim.runner import (
        AutoscaleSimConfig,
        planner_variant,
        trace_requests,
    )
    from benchmarks.fleet_sim.fleet import FleetSpec
    from benchmarks.workloads import load_workload
    from benchmarks.workloads.overlay import overlay

    err = Console(stderr=True, width=None if sys.stderr.isatty() else 220)
    console = err if as_json else Console(width=None if sys.stdout.isatty() else 220)
    command = "pdorch bench autoscale " + " ".join(shlex.quote(a) for a in sys.argv[1:][2:])
    if sys.argv[1:3] != ["bench", "autoscale"]:
        command = "pdorch bench autoscale ..."
    if merge:
        if workload is not None or trace is not None or live:
            raise typer.BadParameter(
                "--merge reads finished runs: no --workload, --trace or --live",
                param_hint="--merge",
            )
        order = split_list(planners, "--planners") if planners else None
        _merge(split_list(merge, "--merge"), order, command, out, as_json, console, err)
        return
    if (workload is None) == (trace is None):
        raise typer.BadParameter(
            "give exactly one of --workload or --trace", param_hint="--workload"
        )
    if live and jobs != 1:
        raise typer.BadParameter("--live runs one planner: no --jobs", param_hint="--jobs")
    if not live and time_scale != DEFAULT_TIME_SCALE:
        raise typer.BadParameter("only with --live", param_hint="--time-scale")
    if policy_file is None:
        policy_file = DEFAULT_LIVE_POLICY if live else DEFAULT_POLICY
    if live and initial_fleet is None:
        initial_fleet = DEFAULT_LIVE_FLEET
    try:
        policy = load_policy(policy_file)
    except (PolicyError, OSError) as e:
        raise typer.BadParameter(str(e), param_hint="--policy") from None
    names = split_list(planners or ["pdorch" if live else DEFAULT_PLANNERS], "--planners")
    if live and (len(names) != 1 or "+" in names[0]):
        raise typer.BadParameter(
            "--live runs exactly one planner, without a +variant (set role_switching in the "
            "policy instead)",
            param_hint="--planners",
        )
    unknown = [n for n in names if n.partition("+")[0] not in planner_names()]
    if unknown:
        raise typer.BadParameter(
            f"unknown planner(s) {', '.join(unknown)}; known: {', '.join(planner_names())}",
            param_hint="--planners",
        )
    for n in names:
        try:
            planner_variant(n)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--planners") from None
    initial = None
    if initial_fleet is not None:
        try:
            spec = FleetSpec.parse(initial_fleet)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--initial-fleet") from None
        if spec.colocated or not spec.prefill or not spec.decode:
            raise typer.BadParameter(
                "give prefill and decode only, like 2P2D", param_hint="--initial-fleet"
            )
        initial = {Pool.PREFILL: spec.prefill, Pool.DECODE: spec.decode}
    kw: dict[str, object] = {}
    for item in param:
        key, sep, value = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--param")
        try:
            kw[key] = json.loads(value)
        except json.JSONDecodeError:
            kw[key] = value
    if max_requests is not None:
        kw["max_requests"] = max_requests
    source = str(trace) if trace is not None else str(workload)
    if rate_mode not in ("overlay", "compress"):
        raise typer.BadParameter("overlay or compress", param_hint="--rate-mode")
    overlay_k = rate_scale if trace is not None and rate_mode == "overlay" else None
    try:
        wl = load_workload(
            source,
            trace_format=trace_format,
            rate_scale=1.0 if overlay_k is not None else rate_scale,
            seed=seed,
            **kw,
        )
        if overlay_k is not None:
            wl = overlay(wl, overlay_k, seed=seed)
    except (ValueError, FileNotFoundError) as e:
        raise typer.BadParameter(str(e), param_hint="--trace" if trace else "--workload") from None
    if abs(record_s / 0.5 - round(record_s / 0.5)) > 1e-9:
        raise typer.BadParameter("a multiple of 0.5 s", param_hint="--record-s")
    cfg = AutoscaleSimConfig(
        router_policy=router_policy,
        block_size=block_size,
        record_s=record_s,
        fast_forward=fast_forward,
        seed=seed,
        role_switching=role_switching,
        initial=initial,
    )

    settings = {
        "workload": source,
        "workload_name": wl.name,
        "workload_meta": wl.meta,
        "trace_format": trace_format,
        "policy_file": str(policy_file),
        "policy": policy.model_dump(mode="json"),
        "planners": names,
        "rate_scale": rate_scale,
        "rate_mode": rate_mode if trace is not None else "workload",
        "max_requests": max_requests,
        "role_switching": role_switching,
        "initial_fleet": initial_fleet,
        "router_policy": router_policy,
        "block_size": block_size,
        "record_s": record_s,
        "tick_s": cfg.tick_s,
        "seed": seed,
        "params": kw,
        "requests": wl.num_requests,
        "fast_forward": fast_forward,
        "slo": policy.slo.model_dump(mode="json"),
    }
    if live:
        from pdorch.cli.bench_autoscale_live import run_live_bench

        assert cfg.initial is not None  # --live always has an initial fleet
        settings.update(live=True, time_scale=time_scale, planner=names[0], rows=max_requests)
        run_live_bench(
            workload=wl,
            policy=policy,
            planner=names[0],
            sim_config=cfg,
            time_scale=time_scale,
            settings=settings,
            command=command,
            as_json=as_json,
            out=out,
            err=err,
            console=console,
        )
        return

    wall0 = time.perf_counter()
    requests = trace_requests(wl, block_size)
    horizon = max((r[0] for r in requests), default=0.0) or 1.0
    # forked before the progress display starts its refresh thread (parallel.py)
    with (
        PlannerPool(wl, policy, cfg, requests, min(jobs, len(names))) as pool,
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=err,
            transient=as_json,
        ) as progress,
    ):
        tasks = {n: progress.add_task(f"{n:>16}", total=horizon, status="") for n in names}

        def tick(name: str, t: float) -> None:
            progress.update(tasks[name], completed=min(t, horizon), status=f"t={t:.0f}s")

        def done(name: str, res: dict[str, Any]) -> None:
            status = f"done in {res['sim_wall_s']:.1f}s ({res['sim_cpu_s']:.1f}s CPU)"
            progress.update(tasks[name], completed=horizon, status=status)

        try:
            runs = pool.run(names, tick, done)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    wall = time.perf_counter() - wall0
    run = {"command": command, "settings": settings, "planners": runs, "wall_s": wall}
    title = f"bench autoscale: {wl.name} ({wl.num_requests} requests)"
    emit(run, title, out, as_json, console, err)


def _merge(
    folders: list[str],
    order: list[str] | None,
    command: str,
    out: Path | None,
    as_json: bool,
    console: Any,
    err: Any,
) -> None:
    from benchmarks.autoscale_sim.merge import MergeError, load_run, merge_runs

    try:
        run = merge_runs([(Path(f), load_run(Path(f))) for f in folders], command, order)
    except MergeError as e:
        raise typer.BadParameter(str(e), param_hint="--merge") from None
    s = run["settings"]
    title = f"bench autoscale: {s.get('workload_name')} ({s.get('requests')} requests), merged"
    emit(run, title, out, as_json, console, err)
