"""The issue's flap measure: direction changes of a pool inside any 10-minute window.

Goal (issue 11): at most 2 direction changes per pool per 10 minutes. A *direction change* is
a change of the pool's provisioned count whose sign is opposite to the change before it
(`events` of `results.json`, scale and role move alike); the measure is the most of them in
any `FLAP_WINDOW_S` window, sliding, so a flap straddling a clock boundary is not split.
Computed from `events`, which every `results.json` has, so the report and the `--json`
summary give it for merged folders of older runs too.
"""

from __future__ import annotations

from typing import Any

FLAP_WINDOW_S = 600.0


def direction_change_times(events: list[dict[str, Any]], pool: str) -> list[float]:
    """When `pool`'s provisioned count changed direction (`events` as in `results.json`)."""
    times: list[float] = []
    last = 0
    for e in events:
        if e["pool"] != pool:
            continue
        d = int(e["to"]) - int(e["from"])
        if d == 0:
            continue
        sign = 1 if d > 0 else -1
        if last and sign != last:
            times.append(float(e["t_s"]))
        last = sign
    return times


def worst_window_direction_changes(
    events: list[dict[str, Any]], pool: str, window_s: float = FLAP_WINDOW_S
) -> int:
    """The most direction changes of `pool` inside any `window_s` window (sliding)."""
    times = direction_change_times(events, pool)
    return max(
        (sum(1 for u in times[i:] if u < t + window_s) for i, t in enumerate(times)), default=0
    )
