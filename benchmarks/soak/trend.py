"""Is a soak series flat? Least-squares slope per hour against a tolerance (pure).

For one metric's samples `(t_i, y_i)` (t in seconds from the load's start), keeping only those
with `t_i >= warmup_s` (caches fill, pools open and the allocator settles in the first minutes;
that growth is not a leak):

    slope = sum((t_i - t_mean) * (y_i - y_mean)) / sum((t_i - t_mean)^2)     (units per second)
    slope_per_h = 3600 * slope

A metric is **flat** when `|slope_per_h| <= tolerance_per_h`, with

    tolerance_per_h = max(abs_per_h, rel_per_h * |median(y)|)

`abs_per_h` is a floor in the metric's own unit (an fd or socket leak of one per engine restart,
at one restart every 5 minutes, is 12 per hour: above the floor of 6), `rel_per_h` a share of
the metric's typical level (RSS: 5 % per hour of ~100 MiB is 5 MiB/h; the floor 8 MiB/h is
what the allocator's noise over a 30-minute window reads as). Defaults per metric: `LIMITS`.
Metrics with `verdict=False` are reported but do not decide (throughput depends on the
machine's other load, failures on the restarts). Fewer than 3 samples after the warm-up: the
slope is None and the metric is not flat (nothing can be said).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Limit:
    unit: str
    abs_per_h: float
    rel_per_h: float = 0.0
    verdict: bool = True


LIMITS: dict[str, Limit] = {
    "rss_mib": Limit("MiB", 8.0, 0.05),
    "open_fds": Limit("fds", 6.0),
    "sockets": Limit("sockets", 6.0),
    "upstream_http": Limit("connections", 6.0),
    "upstream_zmq": Limit("connections", 6.0),
    "kv_leases": Limit("leases", 4.0),
    "index_blocks": Limit("blocks", 64.0, 0.10),
    "tracked_requests": Limit("requests", 4.0),
    "token_load_decode_blocks": Limit("blocks", 16.0, 0.25),
    "token_load_prefill_tokens": Limit("tokens", 256.0, 0.25),
    "ok_per_s": Limit("requests/s", 0.0, 0.20, verdict=False),
    "requests_failed": Limit("requests", 0.0, 0.0, verdict=False),
}


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of `y` over `t` (seconds), times 3600; None under 3 points or when
    every `t` is the same."""
    if len(points) < 3:
        return None
    t_mean = statistics.fmean(t for t, _ in points)
    y_mean = statistics.fmean(y for _, y in points)
    spread = sum((t - t_mean) ** 2 for t, _ in points)
    if spread == 0:
        return None
    return 3600.0 * sum((t - t_mean) * (y - y_mean) for t, y in points) / spread


def trend(
    samples: Sequence[dict[str, Any]], metric: str, warmup_s: float, limit: Limit
) -> dict[str, Any]:
    """One metric's row: slope, tolerance, flat, and its level (first/median/max/last)."""
    points = [
        (float(s["t_s"]), float(s[metric]))
        for s in samples
        if s["t_s"] >= warmup_s and s.get(metric) is not None
    ]
    values = [y for _, y in points]
    slope = slope_per_hour(points)
    median = statistics.median(values) if values else 0.0
    tolerance = max(limit.abs_per_h, limit.rel_per_h * abs(median))
    return {
        "unit": limit.unit,
        "samples": len(points),
        "slope_per_h": None if slope is None else round(slope, 3),
        "tolerance_per_h": round(tolerance, 3),
        "flat": slope is not None and abs(slope) <= tolerance,
        "decides": limit.verdict,
        "first": values[0] if values else None,
        "median": round(median, 3),
        "max": max(values) if values else None,
        "last": values[-1] if values else None,
    }


def verdict(
    samples: Sequence[dict[str, Any]], warmup_s: float, limits: dict[str, Limit] | None = None
) -> dict[str, Any]:
    """Every metric's trend and `flat`: True when every deciding metric is flat."""
    rows = {m: trend(samples, m, warmup_s, lim) for m, lim in (limits or LIMITS).items()}
    return {
        "flat": all(r["flat"] for r in rows.values() if r["decides"]),
        "not_flat": [m for m, r in rows.items() if r["decides"] and not r["flat"]],
        "warmup_s": warmup_s,
        "metrics": rows,
    }
