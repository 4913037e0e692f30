"""Breach -> added capacity over every episode of a run: the distribution per pool and kind.

Input: `capacity_episodes` as `result.py` writes them (`{pool, breach_s, capacity_s,
seconds, kind, by, ordered_s}`; older runs lack `ordered_s`). Output per pool: `all`,
`by_kind` (`cold_start` = a cold start became ready, `move` = a role move landed, `recall` =
a draining replica was taken back) and `breach_to_order` (`ordered_s - breach_s`: the
planner's part; the rest is the actuator's delivery), each `{count, median_s, p90_s, max_s,
share_within_goal}`, the share being episodes within `CAPACITY_GOAL_S` (issue 11's 10 s).
Percentiles interpolate linearly (`observe.percentile`). Shared by `result.py` and the
report, so merged folders of older runs get the table too.
"""

from __future__ import annotations

from typing import Any

from benchmarks.autoscale_sim.observe import percentile

CAPACITY_GOAL_S = 10.0  # issue 11: breach -> added capacity within 10 s
KIND_NAMES = {"ready": "cold_start", "moved": "move", "recall": "recall"}  # membership kind
POOL_NAMES = ("prefill", "decode")


def _spread(values: list[float]) -> dict[str, Any]:
    v = sorted(values)
    if not v:
        return {
            "count": 0,
            "median_s": None,
            "p90_s": None,
            "max_s": None,
            "share_within_goal": None,
        }
    return {
        "count": len(v),
        "median_s": percentile(v, 50),
        "p90_s": percentile(v, 90),
        "max_s": v[-1],
        "share_within_goal": sum(1 for x in v if x <= CAPACITY_GOAL_S + 1e-9) / len(v),
    }


def capacity_distribution(episodes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per pool: breach -> capacity over every episode, all and by kind (module docstring)."""
    out: dict[str, dict[str, Any]] = {}
    for pool in POOL_NAMES:
        mine = [e for e in episodes if e["pool"] == pool]
        out[pool] = {
            "all": _spread([float(e["seconds"]) for e in mine]),
            "by_kind": {
                name: _spread([float(e["seconds"]) for e in mine if e["kind"] == kind])
                for kind, name in KIND_NAMES.items()
            },
            "breach_to_order": _spread(
                [
                    float(e["ordered_s"]) - float(e["breach_s"])
                    for e in mine
                    if e.get("ordered_s") is not None
                ]
            ),
        }
    return out
