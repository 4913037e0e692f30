"""`benchmarks/fleet_sim/ttft_parts.py`: a P/D run's TTFT split into prefill alone, lost hits,
prefill wait and the time after the prefill leg (which the simulator now records)."""

from __future__ import annotations

from benchmarks.fleet_sim.ttft_parts import measure


def test_the_parts_of_a_pd_run() -> None:
    got = measure("2P2D", 3.0, "token_load", 60)
    assert got["requests"] == 60
    band = got["p90_p99_band_mean_ms"]
    without = got["p95_without_ms"]
    p95 = got["ttft_p95_ms"]
    assert isinstance(band, dict) and isinstance(without, dict) and isinstance(p95, float)
    # P/D requests: their prefill leg's end is recorded, so the time after it is seen, and the
    # KV transfer alone is part of it
    assert band["after_prefill"] > 0.0
    assert 0.0 < band["transfer"] <= band["after_prefill"] + 1e-6
    # removing any non-negative part cannot raise the p95
    assert all(v <= p95 for v in without.values())
