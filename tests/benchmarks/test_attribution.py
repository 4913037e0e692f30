"""`benchmarks/autoscale_sim/attribution.py`: the parts sum to the gap, by phase."""

from __future__ import annotations

from typing import Any

from benchmarks.autoscale_sim.attribution import attribute


def run(events: list[tuple[float, str, int, int]], gpu_s: dict[str, float]) -> dict[str, Any]:
    return {
        "initial": {"prefill": 1, "decode": 1},
        "events": [{"t_s": t, "pool": p, "from": a, "to": b} for t, p, a, b in events],
        "end_s": 1000.0,
        "lifecycle_s": {p: {"ready": [], "drained": []} for p in ("prefill", "decode")},
        "gpu_hours_by_pool": {p: v / 3600.0 for p, v in gpu_s.items()},
    }


def test_a_hold_after_the_reference_falls_is_a_hold_and_an_early_order_a_ramp() -> None:
    # reference decode: 1 -> 3 at 500 s, back to 1 at 600 s; the run orders at 360 s (20 s
    # before the rise's cold start, 380 s) and holds 3 until 800 s
    ref = run([(500.0, "decode", 1, 3), (600.0, "decode", 3, 1)], {"prefill": 1e3, "decode": 1200})
    mine = run([(360.0, "decode", 1, 3), (800.0, "decode", 3, 1)], {"prefill": 1e3, "decode": 1880})
    row = attribute(ref, mine)["decode"]
    # 380-500 s is within one cold start of the rise: ramp; 360-380 s is before it: steady
    assert abs(row["ramp_above"] * 3600 - 2 * 120) < 1e-6
    assert abs(row["steady_above"] * 3600 - 2 * 20) < 1e-6
    assert abs(row["hold_above"] * 3600 - 2 * 200) < 1e-6  # 600-800 s
    assert row["opening_above"] == 0
    assert abs(row["rest"]) < 1e-9
    assert attribute(ref, mine)["prefill"]["gap"] == 0
