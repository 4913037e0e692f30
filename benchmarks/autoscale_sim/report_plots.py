"""The PNGs of the autoscaling report (matplotlib, Agg backend; see `report.py` for the input).

- `replicas_<planner>.png`: per planner, four panels sharing a time axis (minutes): provisioned
  replicas per pool (ready + pending as a step line, the pending part shaded, draining dotted),
  arrival rate, observed p90 TTFT and p90 ITL with their SLO lines.
- `gpu_hours_vs_attainment.png`: one point per planner.
- `per_minute_attainment.png`: per-minute attainment (both SLOs), one line per planner.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["Plots", "SloLines", "plot_all", "slo_targets"]

_POOLS = (("prefill", "tab:blue"), ("decode", "tab:orange"))


@dataclass(frozen=True, slots=True)
class SloLines:
    ttft_s: float
    itl_s: float
    attainment: float | None


@dataclass(slots=True)
class Plots:
    """File names (relative to the output folder) of the PNGs written."""

    scatter: str | None = None
    per_minute: str | None = None
    replicas: dict[str, str] = field(default_factory=dict)


def slo_targets(settings: dict[str, Any]) -> SloLines | None:
    """The SLO from `settings["slo"]` or `settings["policy"]["slo"]` (policy-YAML shape)."""
    slo = settings.get("slo")
    if not isinstance(slo, dict):
        policy = settings.get("policy")
        slo = policy.get("slo") if isinstance(policy, dict) else None
    if not isinstance(slo, dict):
        return None
    try:
        ttft = float(slo["ttft_ms"]["target"]) / 1e3
        itl = float(slo["itl_ms"]["target"]) / 1e3
    except (KeyError, TypeError, ValueError):
        return None
    att = slo.get("attainment")
    return SloLines(ttft, itl, float(att) if isinstance(att, int | float) else None)


def _pyplot() -> ModuleType:
    """pyplot on the Agg backend, imported on first use (CLI start-up does not pay for it)."""
    import matplotlib

    matplotlib.use("Agg")  # headless: reports are rendered in CI and on servers
    import matplotlib.pyplot as plt

    return plt


def _file_name(prefix: str, planner: str) -> str:
    return f"{prefix}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', planner)}.png"


def _pool_series(timeline: list[dict[str, Any]], pool: str, key: str) -> list[float]:
    return [float(tick.get(pool, {}).get(key, 0)) for tick in timeline]


def _opt(values: list[Any]) -> list[float]:
    return [float("nan") if v is None else float(v) for v in values]


def _plot_replicas(name: str, p: dict[str, Any], slo: SloLines | None, path: Path) -> None:
    tl = p.get("timeline", [])
    minutes = [float(t["t_s"]) / 60.0 for t in tl]
    plt = _pyplot()
    fig, axes = plt.subplots(
        4, 1, figsize=(10, 9), sharex=True, gridspec_kw={"height_ratios": [2.2, 1, 1, 1]}
    )
    ax = axes[0]
    peak = 1.0
    for pool, colour in _POOLS:
        ready = _pool_series(tl, pool, "ready")
        pending = _pool_series(tl, pool, "pending")
        draining = _pool_series(tl, pool, "draining")
        prov = [r + q for r, q in zip(ready, pending, strict=True)]
        peak = max([peak, *prov, *draining])
        ax.step(minutes, prov, where="post", color=colour, label=f"{pool} provisioned")
        ax.fill_between(
            minutes, ready, prov, step="post", color=colour, alpha=0.3, label=f"{pool} pending"
        )
        if any(draining):
            ax.step(minutes, draining, where="post", color=colour, ls=":", label=f"{pool} draining")
    ax.set_ylabel("replicas")
    ax.set_ylim(0, 1.35 * peak + 1)  # headroom: the legend sits above the lines, not on them
    ax.legend(loc="upper left", fontsize=8, ncol=3)
    ax.set_title(f"{name}: replicas per pool, load and observed latency")
    ax.grid(alpha=0.3)
    axes[1].plot(minutes, _opt([t.get("arrival_rps") for t in tl]), color="tab:green")
    axes[1].set_ylabel("arrivals (req/s)")
    for ax, key, label, colour, target in (
        (axes[2], "ttft_p90_s", "p90 TTFT (s)", "tab:purple", slo.ttft_s if slo else None),
        (axes[3], "itl_p90_s", "p90 ITL (ms)", "tab:red", slo.itl_s if slo else None),
    ):
        scale = 1e3 if key == "itl_p90_s" else 1.0
        ys = [v * scale for v in _opt([t.get(key) for t in tl])]
        ax.plot(minutes, ys, color=colour)
        top = max([0.0, *(y for y in ys if y == y)])  # y == y drops NaN (no sample that tick)
        if target is not None:
            ax.axhline(target * scale, color="black", ls="--", lw=1, label="SLO target")
            ax.legend(loc="upper left", fontsize=8)
            top = max(top, target * scale)
        ax.set_ylabel(label)
        ax.set_ylim(0, 1.2 * top if top > 0 else 1.0)
    for ax in axes[1:]:
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("time (min)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_scatter(run: dict[str, Any], slo: SloLines | None, path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    for name, p in run["planners"].items():
        x, y = float(p["gpu_hours"]), 100.0 * float(p["attainment"]["both"])
        ax.scatter([x], [y], s=40)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=9)
    if slo is not None and slo.attainment is not None:
        ax.axhline(100 * slo.attainment, color="black", ls="--", lw=1, label="attainment goal")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("GPU-hours")
    ax.set_ylabel("requests within both SLOs (%)")
    ax.set_title("Cost against SLO attainment (up and left is better)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_per_minute(run: dict[str, Any], slo: SloLines | None, path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for name, p in run["planners"].items():
        pm = [m for m in p.get("per_minute", []) if m.get("requests", 0) > 0]
        ax.plot(
            [float(m["t_s"]) / 60.0 for m in pm],
            [100.0 * float(m["attainment_both"]) for m in pm],
            label=name,
            lw=1.2,
        )
    if slo is not None and slo.attainment is not None:
        ax.axhline(100 * slo.attainment, color="black", ls="--", lw=1, label="attainment goal")
    ax.set_xlabel("time (min)")
    ax.set_ylabel("requests within both SLOs (%)")
    ax.set_title("Per-minute SLO attainment (minutes with requests)")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_all(run: dict[str, Any], out_dir: Path) -> Plots:
    """Write every PNG into `out_dir`; return their names."""
    slo = slo_targets(run.get("settings", {}))
    plots = Plots()
    if not run["planners"]:
        return plots
    plots.scatter = "gpu_hours_vs_attainment.png"
    _plot_scatter(run, slo, out_dir / plots.scatter)
    plots.per_minute = "per_minute_attainment.png"
    _plot_per_minute(run, slo, out_dir / plots.per_minute)
    for name, p in run["planners"].items():
        if p.get("timeline"):
            png = _file_name("replicas", name)
            _plot_replicas(name, p, slo, out_dir / png)
            plots.replicas[name] = png
    return plots
