"""`report.md` and PNG plots for a `pdorch bench autoscale` run (its `results.json` dict).

The input is the run dict (the contract with the simulator, one entry per planner):

    {"command": str, "settings": {...}, "planners": {name: {
        "attainment" | "attainment_p90" | "attainment_loose": {"both", "ttft", "itl"},
        "per_minute": [{"t_s", "requests", "attainment_both"}],
        "gpu_hours": float, "lost": int, "requests": int,
        "direction_changes": {"prefill": int, "decode": int},
        "events": [{"t_s", "pool", "from", "to", "reason", "kind"}],
        "timeline": [{"t_s", "arrival_rps", "ttft_p90_s", "itl_p90_s",
                      "prefill": {"ready", "pending", "draining"}, "decode": {...}}],
        "time_to_capacity_s": [float, ...],
        "capacity_episodes": [{"pool", "breach_s", "capacity_s", "seconds", "kind", "by",
                               "ordered_s"}],
        "recalls": {"prefill": int, "decode": int}, "drain_moves": {...},
        "role_moves": [{"replica", "from", "to", "asked_s", "ready_s", "seconds"}]}}}

`capacity_episodes` and `role_moves` (optional) give the "Breach → added capacity" (with
the distribution over every breach by kind, `capacity.py`, and the recalls when present) and
"Role moves" sections. A merged run (`merge.py`) has `sources`, one `{"folder", "command",
"planners", "wall_s"}` per folder: the report lists each folder's command under the merge's.

`summary_table(run)` gives one row per planner with the numbers both the CLI's table and
`report.md` print (so they agree): the ratios are `gpu_hours / oracle gpu_hours` and
`gpu_hours / static-peak gpu_hours` (None when that planner is not in the run). The worst
minute is the lowest `attainment_both` over minutes with at least one request.

SLO lines in the plots come from `settings["slo"]` or `settings["policy"]["slo"]` in the
policy-YAML shape (`{"ttft_ms": {"target"}, "itl_ms": {"target"}, "attainment"}`); without
one the plots have no SLO lines.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.autoscale_sim.capacity import CAPACITY_GOAL_S, capacity_distribution
from benchmarks.autoscale_sim.flaps import worst_window_direction_changes
from benchmarks.autoscale_sim.report_plots import Plots, plot_all, slo_targets

__all__ = ["render_report", "summary_table"]

ORACLE = "oracle"
STATIC_PEAK = "static-peak"


def _ratio(value: float, base: float | None) -> float | None:
    if base is None or base <= 0:
        return None
    return value / base


def _worst_minute(per_minute: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    rows = [m for m in per_minute if m.get("requests", 0) > 0]
    if not rows:
        return None, None
    worst = min(rows, key=lambda m: float(m["attainment_both"]))
    return float(worst["attainment_both"]), float(worst["t_s"])


def summary_table(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per planner (run order): attainment, GPU-hours and ratios, events, capacity."""
    planners: dict[str, dict[str, Any]] = run["planners"]
    base_oracle = planners.get(ORACLE, {}).get("gpu_hours")
    base_static = planners.get(STATIC_PEAK, {}).get("gpu_hours")
    rows: list[dict[str, Any]] = []
    for name, p in planners.items():
        ttc = [float(x) for x in p.get("time_to_capacity_s", [])]
        worst, worst_t = _worst_minute(p.get("per_minute", []))
        gpu_h = float(p["gpu_hours"])
        dc = p.get("direction_changes", {})
        events = p.get("events", [])
        rows.append(
            {
                "planner": name,
                "attainment": dict(p["attainment"]),
                "attainment_p90": dict(p.get("attainment_p90", {})),
                "attainment_loose": dict(p.get("attainment_loose", {})),
                "gpu_hours": gpu_h,
                "vs_oracle": _ratio(gpu_h, base_oracle),
                "vs_static_peak": _ratio(gpu_h, base_static),
                "requests": int(p.get("requests", 0)),
                "lost": int(p.get("lost", 0)),
                "direction_changes_prefill": int(dc.get("prefill", 0)),
                "direction_changes_decode": int(dc.get("decode", 0)),
                "direction_changes_worst_10min_prefill": worst_window_direction_changes(
                    events, "prefill"
                ),
                "direction_changes_worst_10min_decode": worst_window_direction_changes(
                    events, "decode"
                ),
                "scale_events": len(p.get("events", [])),
                "time_to_capacity_median_s": statistics.median(ttc) if ttc else None,
                "time_to_capacity_max_s": max(ttc) if ttc else None,
                "worst_minute_attainment": worst,
                "worst_minute_t_s": worst_t,
            }
        )
    return rows


# --------------------------------------------------------------------------------------------
# Markdown


RECALL_KEYS = ("recalls", "drain_moves")
POOLS = ("prefill", "decode")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.2f}"


def _triple(att: dict[str, float]) -> str:
    if not att:
        return "-"
    return " / ".join(_pct(att.get(k)) for k in ("both", "ttft", "itl"))


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else fmt.format(x)


_MAIN_HEADER = (
    "planner",
    "SLO both / TTFT / ITL %",
    "p90 both / TTFT / ITL %",
    "loose both / TTFT / ITL %",
    "GPU-h",
    "x oracle",
    "x static-peak",
    "requests",
    "lost",
    "dir. changes P / D",
    "worst 10 min P / D",
    "scale events",
    "time to capacity median / max s",
)


def _main_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in rows:
        out.append(
            [
                f"`{r['planner']}`",
                _triple(r["attainment"]),
                _triple(r["attainment_p90"]),
                _triple(r["attainment_loose"]),
                f"{r['gpu_hours']:.2f}",
                _num(r["vs_oracle"], "{:.3f}"),
                _num(r["vs_static_peak"], "{:.3f}"),
                str(r["requests"]),
                str(r["lost"]),
                f"{r['direction_changes_prefill']} / {r['direction_changes_decode']}",
                f"{r['direction_changes_worst_10min_prefill']} / "
                f"{r['direction_changes_worst_10min_decode']}",
                str(r["scale_events"]),
                f"{_num(r['time_to_capacity_median_s'], '{:.1f}')} / "
                f"{_num(r['time_to_capacity_max_s'], '{:.1f}')}",
            ]
        )
    return out


def _table(header: tuple[str, ...] | list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _events_rows(run: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    kinds: list[str] = []
    counts: dict[str, dict[str, int]] = {}
    for name, p in run["planners"].items():
        c = counts[name] = {}
        for e in p.get("events", []):
            key = f"{e.get('pool', '?')}:{e.get('kind', '?')}"
            c[key] = c.get(key, 0) + 1
            if key not in kinds:
                kinds.append(key)
    kinds.sort()
    header = ["planner", *kinds]
    return header, [[f"`{n}`", *(str(c.get(k, 0)) for k in kinds)] for n, c in counts.items()]


def _capacity_rows(run: dict[str, Any]) -> list[list[str]]:
    """Per planner and pool: breach -> added capacity episodes (`result.py`'s definition)."""
    out = []
    for name, p in run["planners"].items():
        eps = p.get("capacity_episodes")
        if eps is None:
            continue
        for pool in ("prefill", "decode"):
            mine = [e for e in eps if e["pool"] == pool]
            secs = [float(e["seconds"]) for e in mine]
            listed = ", ".join(
                f"{e['breach_s']:.0f}→{e['capacity_s']:.0f} s ({e['kind']}, {e['by']})"
                for e in mine[:6]
            )
            out.append(
                [
                    f"`{name}`",
                    pool,
                    str(len(mine)),
                    _num(statistics.median(secs) if secs else None, "{:.1f}"),
                    _num(max(secs) if secs else None, "{:.1f}"),
                    str(sum(1 for e in mine if e["kind"] == "moved")),
                    listed + (" …" if len(mine) > 6 else "") or "-",
                ]
            )
    return out


def _distribution_rows(run: dict[str, Any]) -> list[list[str]]:
    """Per planner, pool and kind: the breach -> capacity distribution (`capacity.py`)."""
    out = []
    for name, p in run["planners"].items():
        eps = p.get("capacity_episodes")
        if eps is None:
            continue
        dist = capacity_distribution(eps)
        for pool in ("prefill", "decode"):
            d = dist[pool]
            parts = [("all", d["all"])]
            parts += [(k, v) for k, v in d["by_kind"].items() if v["count"]]
            parts += [("breach → order", d["breach_to_order"])]
            for kind, v in parts:
                out.append(
                    [
                        f"`{name}`",
                        pool,
                        kind,
                        str(v["count"]),
                        _num(v["median_s"], "{:.1f}"),
                        _num(v["p90_s"], "{:.1f}"),
                        _num(v["max_s"], "{:.1f}"),
                        _pct(v["share_within_goal"]),
                    ]
                )
    return out


_DISTRIBUTION_HEADER = (
    "planner",
    "pool",
    "kind",
    "episodes",
    "median s",
    "p90 s",
    "max s",
    f"≤ {CAPACITY_GOAL_S:g} s %",
)

_CAPACITY_HEADER = (
    "planner",
    "pool",
    "breaches",
    "median s",
    "max s",
    "by a role move",
    "breach → capacity (what joined, what breached)",
)


def _markdown(run: dict[str, Any], rows: list[dict[str, Any]], plots: Plots) -> str:
    lines = ["# Autoscaling what-if report", "", "Command:", "", "```", run["command"], "```", ""]
    sources = run.get("sources")
    if sources:  # a merged run (merge.py): each folder's own command made its rows
        lines += ["Merged from these runs (one folder each, the same settings):", "", "```"]
        lines += [s["command"] for s in sources]
        lines += ["```", ""]
        lines += [
            *_table(
                ["folder", "planners", "wall s"],
                [
                    [f"`{s['folder']}`", ", ".join(s["planners"]), _num(s["wall_s"], "{:.0f}")]
                    for s in sources
                ],
            ),
            "",
        ]
    lines += ["## Settings", "", "```json", json.dumps(run.get("settings", {}), indent=2)]
    lines += ["```", ""]
    slo = slo_targets(run.get("settings", {}))
    lines += ["## Results", ""]
    if slo is not None:
        lines += [
            f"SLO: TTFT ≤ {slo.ttft_s * 1e3:g} ms and ITL ≤ {slo.itl_s * 1e3:g} ms"
            + (f", attainment goal {100 * slo.attainment:g} %." if slo.attainment else "."),
            "",
        ]
    lines += [
        "Attainment = share of requests within the SLO (both: TTFT and mean ITL within target); "
        "p90 and loose are the other two SLO pairs of the run. x oracle / x static-peak = "
        "GPU-hours over that planner's GPU-hours (- when it is not in the run).",
        "",
    ]
    lines += [*_table(_MAIN_HEADER, _main_rows(rows)), ""]
    lines += [
        "## Worst minute",
        "",
        "Lowest per-minute attainment (both SLOs), minutes with requests.",
    ]
    lines += [""]
    worst_rows = [
        [
            f"`{r['planner']}`",
            _pct(r["worst_minute_attainment"]),
            _num(None if r["worst_minute_t_s"] is None else r["worst_minute_t_s"] / 60, "{:.0f}"),
        ]
        for r in rows
    ]
    lines += [*_table(["planner", "worst minute attainment %", "at minute"], worst_rows), ""]
    header, ev_rows = _events_rows(run)
    if len(header) > 1:
        lines += ["## Scale events by pool and kind", "", *_table(header, ev_rows), ""]
    cap = _capacity_rows(run)
    if cap:
        lines += [
            "## Breach → added capacity",
            "",
            "Breach: the first planner tick whose observed p90 TTFT (prefill) / ITL (decode) "
            "is over target (`p90`) or whose reactive term asks for more than the floor and the "
            "ready replicas (`reactive`). Added capacity: the next replica joining that pool, "
            "a cold start (`ready`), a role move (`moved`) or a recalled draining replica "
            "(`recall`).",
            "",
            *_table(_CAPACITY_HEADER, cap),
            "",
            "Over every breach, per kind of capacity (`breach → order`: from the breach to "
            "the planner's first scale-up or move into the pool; the rest is delivery):",
            "",
            *_table(_DISTRIBUTION_HEADER, _distribution_rows(run)),
            "",
        ]
        recalls = [
            [f"`{name}`", *(str(p[k].get(pool, 0)) for k in RECALL_KEYS for pool in POOLS)]
            for name, p in run["planners"].items()
            if all(k in p for k in RECALL_KEYS)
        ]
        if recalls:
            lines += [
                "Draining replicas a scale-up took back (recall: its own pool's, serving at "
                "once; drain move: the other pool's, landing after its drain + `switch_s`) "
                "instead of a cold start:",
                "",
                *_table(
                    [
                        "planner",
                        "recalls P",
                        "recalls D",
                        "drain moves into P",
                        "drain moves into D",
                    ],
                    recalls,
                ),
                "",
            ]
    landed = [
        [
            f"`{name}`",
            str(len(moves)),
            _num(statistics.median(secs) if secs else None, "{:.1f}"),
            _num(max(secs) if secs else None, "{:.1f}"),
            ", ".join(
                f"{m['asked_s']:.0f} s {m['from'][0].upper()}→{m['to'][0].upper()}"
                for m in moves[:8]
            )
            + (" …" if len(moves) > 8 else ""),
        ]
        for name, p in run["planners"].items()
        if (moves := p.get("role_moves"))
        for secs in [[float(m["seconds"]) for m in moves if m["seconds"] is not None]]
    ]
    if landed:
        lines += [
            "## Role moves",
            "",
            "Each moved replica from being asked for to serving its new pool (drain of its "
            "old role's in-flight work + `switch_s`).",
            "",
            *_table(["planner", "moved replicas", "median s", "max s", "asked at"], landed),
            "",
        ]
    lines += ["## Plots", ""]
    if plots.scatter:
        lines += ["GPU-hours against attainment (one point per planner):", ""]
        lines += [f"![GPU-hours vs attainment]({plots.scatter})", ""]
    if plots.per_minute:
        lines += ["Per-minute attainment (both SLOs):", "", f"![per-minute]({plots.per_minute})"]
        lines += [""]
    for name, png in plots.replicas.items():
        lines += [
            f"### `{name}`",
            "",
            "Provisioned replicas per pool (ready + pending; pending shaded), arrival rate, "
            "observed p90 TTFT and ITL against the SLO:",
            "",
            f"![{name} replicas]({png})",
            "",
        ]
    return "\n".join(lines)


def render_report(run: dict[str, Any], out_dir: Path) -> None:
    """Write `out_dir/report.md` and its PNGs (see the module docstring)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = summary_table(run)
    plots = plot_all(run, out_dir)
    (out_dir / "report.md").write_text(_markdown(run, rows, plots) + "\n", encoding="utf-8")
