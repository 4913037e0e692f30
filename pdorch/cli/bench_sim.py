"""`pdorch bench sim`: run routing policies on the virtual-time fleet simulator, side by side.

Every policy sees the same arrivals (the same `Workload`). A policy is a benchmark name
(`--policies`, `benchmarks/fleet_sim/policies.py`) or the router section of a YAML file
(`--router-config`: a production fleet file or a router file), so a study runs exactly the
policies a coordinator would. The progress bar goes to stderr;
the report is a rich table (stdout, or stderr with `--json`); `--json` prints exactly one JSON
object on stdout: `{"policies": {NAME: {"ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms",
"itl_p50_ms", "itl_p99_ms", "output_tokens_per_s", "goodput_rps", "hit_rate",
"oracle_hit_rate", "decode_blocks_cv", "completed", ["rollout_p99_s"]}}, "wall_s": X}`.
With `--out DIR`: `report.md`, PNG plots and `results.json` (every metric) there.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from pdorch.cli.options import split_list

if TYPE_CHECKING:
    from router.policies.config import RouterPolicyConfig

RENAMED = {"--model": "--model-profile"}
"""Old flag spellings, accepted as hidden aliases for one release (pdorch/cli/options.py)."""

DEFAULT_POLICIES = (
    "token_load,round_robin,least_request,consistent_hash,cache_aware,kv_overlap,llmd,dynamo"
)


def bench_sim(
    workload: str | None = typer.Option(
        None,
        "--workload",
        help="Named workload (rl-rollouts, agentic, shared-prefix). Exclusive with --trace.",
    ),
    trace: Path | None = typer.Option(
        None, "--trace", help="Trace file to replay (Mooncake JSONL or Azure CSV) instead."
    ),
    trace_format: str | None = typer.Option(
        None, "--trace-format", help="mooncake | azure; default: detected from the file."
    ),
    policies: list[str] = typer.Option(
        [],
        "--policies",
        metavar="NAME,...",
        help="Policies, comma-separated or repeated; NAME/always or NAME/never forces the P/D "
        "decision (see benchmarks/fleet_sim/policies.py for each name's prefill and decode "
        f"pick). Default: {DEFAULT_POLICIES} (none when --router-config is given).",
    ),
    router_config: list[str] = typer.Option(
        [],
        "--router-config",
        metavar="FILE,...",
        help="YAML files with the router's policies, comma-separated or repeated, each run "
        "beside --policies under the file's name (default: none): a whole fleet file (its "
        "pools.*.policy and pd, as the coordinator reads them), a file with a top-level "
        "router: section, or one with prefill/decode/pd.",
    ),
    fleet: list[str] = typer.Option(
        ["4P4D"],
        "--fleet",
        metavar="FLEET,...",
        help="Replicas per pool: 4P4D (4 prefill + 4 decode), 8C (8 colocated), 2P4D2C; "
        "several, comma-separated or repeated (4P4D,8C), run every policy on each (rows "
        "FLEET:POLICY).",
    ),
    model_profile: str = typer.Option(
        "llama-3.1-8b",
        "--model-profile",
        help="Model profile of the simulated engines (timing model; see `pdorch profile`).",
    ),
    gpu: str = typer.Option("h100", "--gpu", help="GPU profile: h100, h200, a100, l40s, b200."),
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor parallel size per replica."),
    block_size: int = typer.Option(
        64,
        "--block-size",
        min=1,
        help="KV block size of the simulated engines and the index. Mooncake traces identify "
        "512-token blocks, so --block-size 512 gives the same hits 8x cheaper.",
    ),
    rate_scale: float = typer.Option(
        1.0, "--rate-scale", min=0.0001, help="Arrival-rate multiplier (2 = twice the load)."
    ),
    max_requests: int | None = typer.Option(
        None,
        "--max-requests",
        min=1,
        help="Replay only the first N trace rows. Default: all of them.",
    ),
    slo_ttft_ms: float = typer.Option(2000.0, "--slo-ttft-ms", help="TTFT SLO for goodput, in ms."),
    slo_itl_ms: float = typer.Option(
        100.0,
        "--slo-itl-ms",
        help="Per-request mean inter-token latency (TPOT) SLO for goodput, in ms.",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the workload and seeded policies."),
    param: list[str] = typer.Option(
        [],
        "--param",
        help="Workload parameter KEY=VALUE (JSON value), repeated for several (never split at "
        "commas), e.g. --param steps=8.",
    ),
    fast_forward: bool = typer.Option(
        True,
        "--fast-forward/--no-fast-forward",
        help="Advance pure-decode steps in bulk (same results, much faster).",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object on stdout; table and progress on stderr."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Directory (created) to write report.md, PNG plots and results.json into. Default: "
        "write no files.",
        file_okay=False,
    ),
) -> None:
    """Compare routing policies on a simulated P/D or colocated fleet (virtual time).

    Example: `pdorch bench sim --workload rl-rollouts --policies token_load,round_robin
    --fleet 4P4D,8C --json --out out/`
    """
    import time

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from benchmarks.fleet_sim.fleet import FleetSpec
    from benchmarks.fleet_sim.metrics import compute_metrics
    from benchmarks.fleet_sim.policies import router_config_for
    from benchmarks.fleet_sim.report import TABLE_COLUMNS, json_summary, write_report
    from benchmarks.fleet_sim.simulator import SimConfig, SimResult, run_simulation
    from benchmarks.workloads import load_workload

    # Wide tables stay readable when the output is a file or a pipe (rich's default is 80).
    err = Console(stderr=True, width=None if sys.stderr.isatty() else 220)
    console = err if as_json else Console(width=None if sys.stdout.isatty() else 220)
    if (workload is None) == (trace is None):
        raise typer.BadParameter(
            "give exactly one of --workload or --trace", param_hint="--workload"
        )
    if not policies and not router_config:
        policies = [DEFAULT_POLICIES]
    names = split_list(policies, "--policies") if policies else []
    router_files = (
        [Path(f) for f in split_list(router_config, "--router-config")] if router_config else []
    )
    routers: dict[str, RouterPolicyConfig] = {}
    for path in router_files:
        label = path.stem if path.stem not in routers and path.stem not in names else str(path)
        routers[label] = _load_router_file(path)
    fleets_given = split_list(fleet, "--fleet")
    try:
        for n in names:
            routers[n] = router_config_for(n)
        specs = [FleetSpec.parse(f) for f in fleets_given]
        if not specs:
            raise ValueError("fleet: no fleet given")
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
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
    try:
        wl = load_workload(
            source, trace_format=trace_format, rate_scale=rate_scale, seed=seed, **kw
        )
    except (ValueError, FileNotFoundError) as e:
        raise typer.BadParameter(str(e), param_hint="--trace" if trace else "--workload") from None

    wall0 = time.perf_counter()
    results: dict[str, SimResult] = {}
    metrics: dict[str, dict[str, object]] = {}
    horizon = max((s.start_s or 0.0 for s in wl.sessions), default=0.0) or 1.0
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=err,
        transient=as_json,
    ) as progress:
        runs = [(spec, name) for spec in specs for name in routers]
        for spec, name in runs:
            label = name if len(specs) == 1 else f"{spec}:{name}"
            task = progress.add_task(f"{label:>24}", total=horizon, status="")

            def tick(t: float, task: TaskID = task) -> None:
                progress.update(task, completed=min(t, horizon), status=f"t={t:.0f}s")

            cfg = SimConfig(
                fleet=spec,
                policy=name,
                router=routers[name],
                model=model_profile,
                gpu=gpu,
                tp=tp,
                block_size=block_size,
                fast_forward=fast_forward,
                seed=seed,
            )
            try:
                res = run_simulation(wl, cfg, progress=tick)
            except ValueError as e:
                raise typer.BadParameter(str(e)) from None
            results[label] = res
            metrics[label] = compute_metrics(res, slo_ttft_ms=slo_ttft_ms, slo_itl_ms=slo_itl_ms)
            progress.update(
                task, completed=horizon, status=f"done in {res.wall_s:.1f}s ({res.cpu_s:.1f}s CPU)"
            )
    wall = time.perf_counter() - wall0

    fleets = ",".join(str(s) for s in specs)
    table = Table(title=f"bench sim: {wl.name} on {fleets} ({model_profile}, {gpu}, tp={tp})")
    cols = [c for c in TABLE_COLUMNS if any(c[0] in m for m in metrics.values())]
    table.add_column("policy")
    for _, label, _ in cols:
        table.add_column(label, justify="right")
    for name, m in metrics.items():
        cells = []
        for key, _, fmt in cols:
            v = m.get(key)
            cells.append("-" if v is None or (isinstance(v, float) and v != v) else fmt.format(v))
        table.add_row(name, *cells)
    console.print(table)

    if out is not None:
        settings = {
            "workload": source,
            "trace_format": trace_format,
            "fleet": fleets,
            "model": model_profile,
            "gpu": gpu,
            "tp": tp,
            "block_size": block_size,
            "rate_scale": rate_scale,
            "max_requests": max_requests,
            "slo_ttft_ms": slo_ttft_ms,
            "slo_itl_ms": slo_itl_ms,
            "seed": seed,
            "params": kw,
            "router_configs": [str(p) for p in router_files],
            "requests": wl.num_requests,
        }
        command = "pdorch bench sim " + " ".join(shlex.quote(a) for a in sys.argv[1:][2:])
        if sys.argv[1:3] != ["bench", "sim"]:
            command = "pdorch bench sim ..."
        write_report(
            out,
            title=f"bench sim: {wl.name} on {fleets}",
            command=command,
            settings=settings,
            results=results,
            metrics=metrics,
            wall_s=wall,
            workload_meta=wl.meta,
        )
        err.print(f"report: {out / 'report.md'}")
    if as_json:
        sys.stdout.write(json.dumps(json_summary(metrics, wall)) + "\n")


def _load_router_file(path: Path) -> RouterPolicyConfig:
    """The router config in `path`: a fleet file's (validated as the coordinator validates
    it, errors with file, line and field) or a router file's (errors name the field)."""
    import yaml

    from pdorch.config.fleet import FleetConfigError, load_fleet_config
    from router.policies.config import PolicyConfigError, load_router_config

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise typer.BadParameter(f"{path}: {e}", param_hint="--router-config") from None
    try:
        if isinstance(data, dict) and "pools" in data:
            return load_fleet_config(path).router_policy_config()
        return load_router_config(path)
    except FleetConfigError as e:
        raise typer.BadParameter(str(e), param_hint="--router-config") from None
    except PolicyConfigError as e:
        raise typer.BadParameter(f"{path}: {e}", param_hint="--router-config") from None
