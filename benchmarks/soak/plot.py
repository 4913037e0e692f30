"""The soak's figure: one panel per deciding metric over time (matplotlib, PNG).

Each panel: the samples, the least-squares line over the samples after the warm-up (its slope
per hour in the title, red when not flat), the warm-up shaded, and a dotted vertical line at
each engine restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PANELS = (
    "rss_mib",
    "open_fds",
    "sockets",
    "upstream_http",
    "kv_leases",
    "index_blocks",
    "tracked_requests",
    "token_load_decode_blocks",
    "ok_per_s",
)


def write_plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display; a file only
    import matplotlib.pyplot as plt

    samples = result["samples"]
    trend = result["trend"]
    warmup_s = float(trend["warmup_s"])
    fig, axes = plt.subplots(3, 3, figsize=(15, 10), sharex=True)
    minutes = [s["t_s"] / 60 for s in samples]
    for ax, metric in zip(axes.flat, PANELS, strict=True):
        ys = [s.get(metric) for s in samples]
        xs = [x for x, y in zip(minutes, ys, strict=True) if y is not None]
        ax.plot(xs, [y for y in ys if y is not None], ".-", markersize=3, linewidth=0.8)
        ax.axvspan(0, warmup_s / 60, color="0.9", zorder=0)
        for restart in result["restarts"]:
            ax.axvline(restart["t_s"] / 60, color="0.5", linestyle=":", linewidth=0.8)
        row = trend["metrics"][metric]
        kept = [
            (s["t_s"], s[metric])
            for s in samples
            if s["t_s"] >= warmup_s and s.get(metric) is not None
        ]
        slope = row["slope_per_h"]
        if slope is not None and kept:
            t_mean = sum(t for t, _ in kept) / len(kept)
            y_mean = sum(y for _, y in kept) / len(kept)
            ends = (kept[0][0], kept[-1][0])
            fit = [y_mean + slope / 3600 * (t - t_mean) for t in ends]
            ax.plot(
                [t / 60 for t in ends], fit, color="tab:red" if not row["flat"] else "tab:green"
            )
        flat = "flat" if row["flat"] else "NOT flat"
        if not row["decides"]:
            flat = "info"
        slope_text = "n/a" if slope is None else f"{slope:+.2f}"
        ax.set_title(
            f"{metric}: {slope_text} {row['unit']}/h (±{row['tolerance_per_h']:g}) {flat}",
            fontsize=9,
            color="black" if row["flat"] or not row["decides"] else "tab:red",
        )
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("minutes")
    fig.suptitle(
        "pdorch bench soak: coordinator resources over time "
        f"(grey: warm-up; dotted: engine restarts; verdict: "
        f"{'flat' if trend['flat'] else 'NOT flat'})"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
