"""`pdorch bench autoscale --live`: the live fleet beside the virtual-time what-if.

`bench_autoscale.py` parses the options and builds the workload; `run_live_bench` runs it
live (`benchmarks/autoscale_live/runner.py`: a real coordinator, `pdorch engine sim`
processes through the local actuator, the in-process control loop, the live load client),
then the what-if of the same workload, policy, planner and initial fleet
(`benchmarks/autoscale_sim/runner.py`), and prints the comparison (stdout, or stderr with
`--json`). `--json`: one object on stdout, `{"live": {...}, "whatif": {...}, "comparison":
[{"metric", "live", "whatif", "ratio"}], "agreement": {POOL: {...}}, "failed",
"scale_ups": {POOL: n}, "scale_downs": {POOL: n}, "lifecycle_s": {POOL: {"ready": [...],
"drained": [...]}}, "wall_s"}`; `--out DIR`: `results.json`, `policy.yaml` (the effective
policy), `report.md`, `timeline.png`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

LIVE_SUMMARY_KEYS = (
    "requests",
    "completed",
    "failed",
    "failed_samples",
    "gpu_hours",
    "gpu_hours_by_pool",
    "scale_ups",
    "scale_downs",
    "lifecycle_s",
    "drains",
    "events",
    "end_s",
    "time_scale",
    "ticks",
    "settled",
    "failed_starts",
    "load_wall_real_s",
)


def _summary(run: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "attainment": run["attainment"]["both"],
        "attainment_ttft": run["attainment"]["ttft"],
        "attainment_itl": run["attainment"]["itl"],
    }
    out.update({k: run[k] for k in keys if k in run})
    return out


def run_live_bench(
    *,
    workload: Any,
    policy: Any,
    planner: str,
    sim_config: Any,
    time_scale: float,
    settings: dict[str, Any],
    command: str,
    as_json: bool,
    out: Path | None,
    err: Any,
    console: Any,
) -> None:
    """The live run, the what-if, the comparison (module docstring)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from benchmarks.autoscale_live.accounting import (
        compare,
        live_accounting,
        timeline_agreement,
        whatif_scale_counts,
    )
    from benchmarks.autoscale_live.report import render_report
    from benchmarks.autoscale_live.runner import LiveAutoscaleConfig, run_live
    from benchmarks.autoscale_sim.runner import run_planner
    from pdorch.cli.bench_autoscale_output import write_effective_policy

    wall0 = time.perf_counter()
    # the live run shares the machine: its load says how far real time was late
    machine: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_1m_before": os.getloadavg()[0]}
    cfg = LiveAutoscaleConfig(
        time_scale=time_scale,
        planner=planner,
        router_policy=sim_config.router_policy,
        block_size=sim_config.block_size,
        initial=dict(sim_config.initial),
    )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=err,
        transient=as_json,
    ) as progress:
        task = progress.add_task("live requests", total=workload.num_requests, status="")
        failures = 0

        def on_result(result: Any) -> None:
            nonlocal failures
            failures += 0 if result.ok else 1
            progress.update(task, advance=1, status=f"{failures} failed")

        raw = asyncio.run(run_live(workload, policy, cfg, on_result=on_result))
        progress.update(task, status=f"{failures} failed; what-if...")
        whatif = run_planner(workload, policy, planner, sim_config)
        progress.update(task, status=f"{failures} failed; done")
    machine["loadavg_1m_after_live"] = os.getloadavg()[0]
    settings = {**settings, "machine": machine}
    live = live_accounting(raw, policy, sim_config.record_s)
    rows = compare(live, whatif)
    agreement = timeline_agreement(live, whatif)
    wall = time.perf_counter() - wall0

    table = Table(title=f"bench autoscale --live: {workload.name} ({live['requests']} requests)")
    for col in ("metric", "live", "what-if", "live / what-if"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for r in rows:
        table.add_row(r["metric"], *(_cell(r[k]) for k in ("live", "whatif", "ratio")))
    for pool, a in agreement.items():
        table.add_row(f"{pool}: timeline, same count", f"{a['equal_share']:.0%}", "", "")
    console.print(table)

    run = {
        "command": command,
        "settings": settings,
        "live": live,
        "whatif": whatif,
        "comparison": rows,
        "agreement": agreement,
        "wall_s": wall,
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
        write_effective_policy(run, out)
        render_report(run, out)
        err.print(f"report: {out / 'report.md'}")
    if as_json:
        w_ups, w_downs = whatif_scale_counts(whatif)
        whatif_summary = _summary(
            whatif,
            (
                "requests",
                "completed",
                "lost",
                "gpu_hours",
                "gpu_hours_by_pool",
                "lifecycle_s",
                "events",
                "end_s",
            ),
        )
        whatif_summary.update(scale_ups=w_ups, scale_downs=w_downs)
        obj = {
            "live": _summary(live, LIVE_SUMMARY_KEYS),
            "whatif": whatif_summary,
            "comparison": rows,
            "agreement": agreement,
            "failed": live["failed"],
            "scale_ups": live["scale_ups"],
            "scale_downs": live["scale_downs"],
            "lifecycle_s": live["lifecycle_s"],
            "wall_s": wall,
        }
        print(json.dumps(obj))


def _cell(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4f}" if 0 < abs(x) < 1 else f"{x:.2f}"
    return str(x)
