"""`report.md`, PNG plots (matplotlib Agg) and `results.json` for a policy comparison.

Plots: `ttft_cdf.png` and `tpot_cdf.png` (latency CDFs, one line per policy),
`load_balance.png` (CV of KV blocks in use across the decoding replicas over time, 60 s
rolling mean, over the arrival window), `hit_rate.png` (prefix-cache hit rate per policy
against the oracle).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.fleet_sim.records import SimResult

JSON_KEYS = (
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "output_tokens_per_s",
    "goodput_rps",
    "hit_rate",
    "oracle_hit_rate",
    "decode_blocks_cv",
    "completed",
)

TABLE_COLUMNS = (
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("ttft_p95_ms", "TTFT p95 ms", "{:.0f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:.0f}"),
    ("itl_p50_ms", "ITL p50 ms", "{:.1f}"),
    ("itl_p99_ms", "ITL p99 ms", "{:.1f}"),
    ("tpot_p99_ms", "TPOT p99 ms", "{:.1f}"),
    ("output_tokens_per_s", "out tok/s", "{:.0f}"),
    ("goodput_rps", "goodput req/s", "{:.2f}"),
    ("goodput_strict_rps", "strict goodput", "{:.2f}"),
    ("hit_rate", "hit rate", "{:.3f}"),
    ("oracle_hit_rate", "oracle", "{:.3f}"),
    ("pooled_lru_hit_rate", "pooled LRU", "{:.3f}"),
    ("decode_blocks_cv", "decode KV CV", "{:.3f}"),
    ("disaggregated_fraction", "P/D share", "{:.2f}"),
    ("completed", "completed", "{:d}"),
    ("rollout_p99_s", "rollout p99 s", "{:.1f}"),
)


def json_summary(metrics: dict[str, dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """The `--json` object: the documented keys per policy (+ `rollout_p99_s` with groups)."""
    out: dict[str, Any] = {}
    for name, m in metrics.items():
        row = {k: _clean(m[k]) for k in JSON_KEYS}
        if "rollout_p99_s" in m:
            row["rollout_p99_s"] = _clean(m["rollout_p99_s"])
        out[name] = row
    return {"policies": out, "wall_s": round(wall_s, 3)}


def _clean(v: Any) -> Any:
    if isinstance(v, float):
        if v != v:  # NaN is not JSON
            return None
        return round(v, 6)
    return v


def markdown_table(metrics: dict[str, dict[str, Any]]) -> str:
    cols = [c for c in TABLE_COLUMNS if any(c[0] in m for m in metrics.values())]
    lines = [
        "| policy | " + " | ".join(c[1] for c in cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for name, m in metrics.items():
        cells = []
        for key, _, fmt in cols:
            v = m.get(key)
            cells.append("-" if v is None or (isinstance(v, float) and v != v) else fmt.format(v))
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_plots(
    results: dict[str, SimResult], metrics: dict[str, dict[str, Any]], out: Path
) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files: list[str] = []

    def cdf(ax: Any, values: np.ndarray, label: str) -> None:
        if values.size == 0:
            return
        v = np.sort(values)
        ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label)

    for key, title, fname in (
        ("ttft", "TTFT (ms)", "ttft_cdf.png"),
        ("tpot", "TPOT (ms per output token)", "tpot_cdf.png"),
    ):
        fig, ax = plt.subplots(figsize=(9.5, 4.5))
        for name, res in results.items():
            done = [r for r in res.requests if r.first_token is not None]
            if key == "ttft":
                vals = np.array([(r.first_token or 0.0) - r.arrival for r in done]) * 1e3
            else:
                vals = (
                    np.array(
                        [
                            ((r.last_token or 0.0) - (r.first_token or 0.0)) / (r.num_output - 1)
                            for r in done
                            if r.num_output > 1
                        ]
                    )
                    * 1e3
                )
            cdf(ax, vals, name)
        ax.set_xscale("log")
        ax.set_xlabel(title)
        ax.set_ylabel("fraction of requests")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        files.append(fname)

    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    for name, res in results.items():
        rows = res.decode_kv_blocks
        if not rows or len(rows[0]) < 2:
            continue
        arr = np.asarray(rows, dtype=float)
        mean = arr.mean(axis=1)
        cv = np.where(mean > 0, arr.std(axis=1) / np.maximum(mean, 1e-9), np.nan)
        t = np.asarray(res.tick_times)
        win = max(1, min(len(t), int(60.0 / max(res.config.tick_s, 1e-9))))
        kernel = np.ones(win) / win
        smooth = np.convolve(np.nan_to_num(cv), kernel, mode="same")
        ax.plot(t, smooth, label=name, linewidth=1)
    # Show the arrival window: a collapsed baseline's backlog would stretch the axis for hours.
    last_arrival = max(
        (max((r.arrival for r in res.requests), default=0.0) for res in results.values()),
        default=0.0,
    )
    if last_arrival > 0:
        ax.set_xlim(0, last_arrival * 1.05)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("CV of decode KV blocks (60 s mean)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out / "load_balance.png", dpi=110)
    plt.close(fig)
    files.append("load_balance.png")

    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    names = list(metrics)
    hits = [metrics[n]["hit_rate"] for n in names]
    oracle = max((metrics[n]["oracle_hit_rate"] for n in names), default=0.0)
    ax.bar(range(len(names)), hits, color="tab:blue", label="hit rate (token-weighted)")
    ax.axhline(oracle, color="tab:red", linestyle="--", label=f"oracle {oracle:.3f}")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("prefix-cache hit rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "hit_rate.png", dpi=110)
    plt.close(fig)
    files.append("hit_rate.png")
    return files


def write_report(
    out: Path,
    *,
    title: str,
    command: str,
    settings: dict[str, Any],
    results: dict[str, SimResult],
    metrics: dict[str, dict[str, Any]],
    wall_s: float,
    workload_meta: dict[str, Any] | None = None,
) -> None:
    """Write `report.md`, the PNGs and `results.json` into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(results, metrics, out)
    summary = json_summary(metrics, wall_s)
    full = {
        "settings": settings,
        "workload_meta": {k: str(v) for k, v in (workload_meta or {}).items()},
        "summary": summary,
        "metrics": {n: {k: _clean(v) for k, v in m.items()} for n, m in metrics.items()},
        "wall_s": wall_s,
    }
    (out / "results.json").write_text(json.dumps(full, indent=2) + "\n")
    lines = [
        f"# {title}",
        "",
        "Command:",
        "",
        "```",
        command,
        "```",
        "",
        "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()),
        "",
        markdown_table(metrics),
        "",
        "Hit rate = prefix-cache hit tokens / prompt tokens of the leg that prefills (vLLM's "
        "counting); oracle = one infinite cache over the same block ids. TPOT/ITL in ms; "
        "goodput = requests meeting both SLOs per second. Simulated: virtual time, the real "
        "router and P/D decision, simulated engine cores. "
        f"Wall time of the whole run: {wall_s:.1f} s.",
        "",
    ]
    for p in plots:
        lines += [f"![{p}]({p})", ""]
    (out / "report.md").write_text("\n".join(lines))
