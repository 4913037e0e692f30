"""`report.md` and `timeline.png` of `pdorch bench autoscale --live --out DIR`.

Input: the `results.json` object (`{"command", "settings", "live", "whatif", "comparison",
"agreement", "wall_s"}`). The plot has three panels sharing the virtual time axis: the
provisioned replicas (ready + pending) of the prefill and of the decode pool, live (solid,
draining dotted) and what-if (dashed), and the arrival rate; the markdown holds the exact
command, the settings, the comparison table (live, what-if, live / what-if), the timeline
agreement, every scale-down with its drain, decision → ready / drained per pool, and the
scale events of both runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.autoscale_live.accounting import POOL_NAMES

PLOT = "timeline.png"


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if 0 < abs(x) < 1 and x != round(x):
            return f"{x:.4f}"
        return f"{x:.2f}"
    return str(x)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _series(timeline: list[dict[str, Any]], pool: str) -> tuple[list[float], list[int], list[int]]:
    ts = [float(r["t_s"]) for r in timeline]
    prov = [
        int(r.get(pool, {}).get("ready", 0)) + int(r.get(pool, {}).get("pending", 0))
        for r in timeline
    ]
    drain = [int(r.get(pool, {}).get("draining", 0)) for r in timeline]
    return ts, prov, drain


def plot(run: dict[str, Any], path: Path) -> None:
    """The three-panel timeline (module docstring)."""
    import matplotlib

    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt

    live, whatif = run["live"], run["whatif"]
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for ax, pool, color in zip(axes, POOL_NAMES, ("tab:blue", "tab:orange"), strict=False):
        t, prov, drain = _series(live["timeline_fine"], pool)
        ax.step(t, prov, where="post", color=color, label=f"live {pool} (ready + pending)")
        ax.step(t, drain, where="post", color=color, linestyle=":", label="live draining")
        t, prov, _ = _series(whatif["timeline"], pool)
        ax.step(
            t, prov, where="post", color="black", linestyle="--", label="what-if (ready + pending)"
        )
        ax.set_ylabel("replicas")
        ax.set_ylim(-0.2, max(3, max(prov, default=0)) + 0.5)
        ax.legend(loc="upper left", fontsize=8)
        ax.set_title(f"{pool} pool")
    ax = axes[2]
    ax.plot(
        [r["t_s"] for r in live["timeline"]],
        [r["arrival_rps"] for r in live["timeline"]],
        label="live arrivals",
    )
    ax.plot(
        [r["t_s"] for r in whatif["timeline"]],
        [r["arrival_rps"] for r in whatif["timeline"]],
        linestyle="--",
        color="black",
        label="what-if arrivals",
    )
    ax.set_ylabel("requests/s")
    ax.set_xlabel("virtual time, s (live: real time / time scale)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(run: dict[str, Any]) -> str:
    s, live, whatif = run["settings"], run["live"], run["whatif"]
    ts = s["time_scale"]
    m = s.get("machine", {})
    lines = [
        f"# Live autoscaling vs the what-if: {s['workload_name']}",
        "",
        "Exact command:",
        "",
        f"    {run['command']}",
        "",
        f"Live: a `pdorch` coordinator, `pdorch engine sim` processes started and stopped by the "
        f"local actuator, the in-process control loop of `pdorch serve --slo-policy` (planner "
        f"`{s['planner']}`), the live load client; time scale {ts:g} (engines {1 / ts:g}x faster "
        f"than the GPU, arrivals {1 / ts:g}x denser). What-if: the same workload, policy and "
        f"planner in the fleet simulator (`benchmarks/autoscale_sim`). All times are virtual "
        f"seconds (live: real / {ts:g}). Policy `{s['policy_file']}` (its times are virtual; "
        f"the live run divides the loop period, drain bound and emulated cold start by "
        f"{1 / ts:g}: `benchmarks/autoscale_live/warp.py`).",
        "",
        f"{live['requests']} requests ({s['rows']} trace rows x rate {s['rate_scale']:g}, "
        f"{s['rate_mode']}), initial fleet {s['initial_fleet']}, live load "
        f"{live['load_wall_real_s']:.1f} s real, {live['ticks']} planner ticks. Machine: "
        f"{m.get('cpus')} CPUs, 1-minute load average {_fmt(m.get('loadavg_1m_before'))} "
        f"before the live run and {_fmt(m.get('loadavg_1m_after_live'))} after it (other "
        "work shares the machine).",
        "",
        f"**Failed requests (live): {live['failed']}** of {live['requests']} "
        f"(non-200, error event, truncated stream, transport error or short output)"
        + (f"; samples: {'; '.join(live['failed_samples'])}" if live["failed_samples"] else "")
        + ".",
        "",
        "## Live vs what-if",
        "",
    ]
    rows = [
        [r["metric"], _fmt(r["live"]), _fmt(r["whatif"]), _fmt(r["ratio"])]
        for r in run["comparison"]
    ]
    lines += _table(["metric", "live", "what-if", "live / what-if"], rows)
    lines += [
        "",
        "Reading: the scale events and the replica timeline are driven mostly by load "
        "(arrivals x ISL, concurrency), which both runs see alike, so they should agree to "
        "within a planner tick or two; TTFT and ITL are not only the engines' but the "
        "machine's: every real millisecond the coordinator, client or an engine process is "
        f"late is {1 / ts:g} virtual milliseconds, so on a loaded machine live latencies come "
        "out longer than the what-if's (the load average above says how loaded it was). "
        "Decision → drained of an idle replica is the drain's polling time; the what-if's "
        "is 0.",
        "",
        f"![replica timeline]({PLOT})",
        "",
        "## Timeline agreement",
        "",
    ]
    rows = [
        [p, str(a["samples"]), f"{a['equal_share']:.0%}", f"{a['mean_abs_diff']:.2f}"]
        for p, a in run["agreement"].items()
    ]
    lines += _table(
        ["pool", "samples (every record_s)", "same provisioned count", "mean abs difference"], rows
    )
    lines += ["", "## Scale-downs (live): drains", ""]
    rows = [
        [
            d["replica"],
            d["pool"],
            f"{d['t_s']:.1f}",
            str(d["in_flight_at_start"]),
            _fmt(d.get("duration_s")),
            _fmt(d.get("duration_real_s")),
            str(d.get("timed_out", "-")),
            str(d.get("cut", "-")),
        ]
        for d in live["drains"]
    ]
    lines += _table(
        [
            "replica",
            "pool",
            "drain began, s",
            "requests in flight then",
            "drained after, s",
            "real s",
            "timed out",
            "cut",
        ],
        rows,
    )
    lines += ["", "## Decision → ready / drained, per pool (virtual s; each replica)", ""]
    rows = []
    for pool in POOL_NAMES:
        lw = live["lifecycle_s"].get(pool, {})
        ww = whatif.get("lifecycle_s", {}).get(pool, {})
        for kind in ("ready", "drained"):
            rows.append(
                [
                    pool,
                    kind,
                    ", ".join(f"{x:.1f}" for x in lw.get(kind, [])) or "-",
                    ", ".join(f"{x:.1f}" for x in ww.get(kind, [])) or "-",
                ]
            )
    lines += _table(["pool", "to", "live", "what-if"], rows)
    lines += ["", "## Scale events", ""]
    rows = [
        [who, f"{e['t_s']:.1f}", e["pool"], f"{e['from']} → {e['to']}", str(e["reason"])]
        for who, run_ in (("live", live), ("what-if", whatif))
        for e in run_["events"]
    ]
    lines += _table(["run", "t, s", "pool", "provisioned", "reason"], rows)
    lines.append("")
    return "\n".join(lines)


def render_report(run: dict[str, Any], out_dir: Path) -> None:
    """Write `report.md` and `timeline.png` into `out_dir`."""
    plot(run, out_dir / PLOT)
    (out_dir / "report.md").write_text(markdown(run), encoding="utf-8")
