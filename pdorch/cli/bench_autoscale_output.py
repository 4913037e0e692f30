"""`pdorch bench autoscale`'s output: the rich table, the `--json` object, the report files.

Shared by a simulated run and a `--merge` of several runs' folders, so both print the same
table and JSON object (`bench_autoscale.py`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from benchmarks.autoscale_sim.flaps import worst_window_direction_changes

SUMMARY_KEYS = (
    "gpu_hours",
    "gpu_hours_by_pool",
    "lost",
    "requests",
    "completed",
    "direction_changes",
    "time_to_capacity_s",
    "sim_cpu_s",
)


def runs_summary(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The `--json` object's planners: `attainment` is the fraction within both SLOs."""
    out = {}
    for name, r in runs.items():
        row: dict[str, Any] = {"attainment": r["attainment"]["both"]}
        row["attainment_ttft"] = r["attainment"]["ttft"]
        row["attainment_itl"] = r["attainment"]["itl"]
        row["attainment_p90"] = r["attainment_p90"]["both"]
        row["attainment_loose"] = r["attainment_loose"]["both"]
        row.update({k: r[k] for k in SUMMARY_KEYS})
        events = r.get("events", [])
        row["direction_changes_worst_10min"] = {
            pool: worst_window_direction_changes(events, pool) for pool in ("prefill", "decode")
        }
        out[name] = row
    return out


def rich_table(runs: dict[str, dict[str, Any]], title: str) -> Any:
    from rich.table import Table

    table = Table(title=title)
    for col in (
        "planner",
        "both",
        "TTFT",
        "ITL",
        "p90 pair",
        "2x pair",
        "GPU-h",
        "/oracle",
        "/static-peak",
        "lost",
        "flips P/D",
        "worst 10 min",
        "to capacity s (max)",
        "CPU s",
    ):
        table.add_column(col, justify="left" if col == "planner" else "right")
    oracle = runs.get("oracle", {}).get("gpu_hours")
    peak = runs.get("static-peak", {}).get("gpu_hours")
    for name, r in runs.items():
        a = r["attainment"]
        ttc = r["time_to_capacity_s"]
        gh = r["gpu_hours"]
        table.add_row(
            name,
            f"{a['both']:.2%}",
            f"{a['ttft']:.2%}",
            f"{a['itl']:.2%}",
            f"{r['attainment_p90']['both']:.2%}",
            f"{r['attainment_loose']['both']:.2%}",
            f"{gh:.3f}",
            f"{gh / oracle:.2f}" if oracle else "-",
            f"{gh / peak:.2f}" if peak else "-",
            str(r["lost"]),
            f"{r['direction_changes']['prefill']}/{r['direction_changes']['decode']}",
            "/".join(
                str(worst_window_direction_changes(r.get("events", []), pool))
                for pool in ("prefill", "decode")
            ),
            f"{max(ttc):.0f}" if ttc else "-",
            f"{r['sim_cpu_s']:.1f}",
        )
    return table


def render(run: dict[str, Any], out: Path) -> None:
    """The report module's `render_report`, or a minimal markdown table until it exists."""
    import importlib

    try:  # by name: the report module is written beside this command (as-report's)
        report = importlib.import_module("benchmarks.autoscale_sim.report")
    except ModuleNotFoundError as e:
        if e.name != "benchmarks.autoscale_sim.report":
            raise
        lines = [
            f"# bench autoscale: {run['settings']['workload_name']}",
            "",
            f"`{run['command']}`",
            "",
            "| planner | within both SLOs | GPU-hours | lost | direction changes P/D |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, r in run["planners"].items():
            d = r["direction_changes"]
            lines.append(
                f"| {name} | {r['attainment']['both']:.2%} | {r['gpu_hours']:.3f} | "
                f"{r['lost']} | {d['prefill']}/{d['decode']} |"
            )
        (out / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return
    report.render_report(run, out)


POLICY_HEADER = """\
# The SLO policy this run used, every field written out with the value it had (defaults
# included), so the run reproduces after a default changes: pass this file as --policy.
# Command: {command}
# A planner variant (a name with `+`, e.g. pdorch+spare-fixed) applies its overrides on top.
"""


def write_effective_policy(run: dict[str, Any], out: Path) -> None:
    """`out/policy.yaml`: the run's policy as validated, defaults written out (the file it
    named keeps only what it set, and a default of the day is not one of tomorrow's)."""
    policy = run.get("settings", {}).get("policy")
    if not isinstance(policy, dict):
        return
    command = " ".join(str(run.get("command", "")).split())
    text = POLICY_HEADER.format(command=command) + yaml.safe_dump(policy, sort_keys=False)
    (out / "policy.yaml").write_text(text, encoding="utf-8")


def emit(
    run: dict[str, Any], title: str, out: Path | None, as_json: bool, console: Any, err: Any
) -> None:
    """The table on `console`; with `out`, results.json, policy.yaml (the effective policy)
    and the report; with `as_json`, the one JSON object on stdout (`{"planners":
    runs_summary, "wall_s"}`)."""
    console.print(rich_table(run["planners"], title))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
        write_effective_policy(run, out)
        render(run, out)
        err.print(f"report: {out / 'report.md'}")
    if as_json:
        summary = {"planners": runs_summary(run["planners"]), "wall_s": run["wall_s"]}
        sys.stdout.write(json.dumps(summary) + "\n")
