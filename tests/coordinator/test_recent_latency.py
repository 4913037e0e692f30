"""The coordinator's rolling last-minute latency windows (`pdorch/app/recent_latency.py`)."""

from __future__ import annotations

import pytest

from autoscale.metrics_sources.histogram import CumulativeHistogram
from pdorch.app.recent_latency import RecentLatency, RollingHistogram

pytestmark = pytest.mark.unit

BOUNDS = (0.1, 0.2, 0.5, 1.0, 2.0)


def test_window_counts_only_the_last_minute_of_observations() -> None:
    rolling = RollingHistogram(BOUNDS, window_s=60.0, slots=6)
    rolling.observe(0.15, now=5.0)  # slot 0
    rolling.observe(0.7, now=25.0)  # slot 2
    rolling.observe(3.0, now=59.0)  # slot 5, above every finite bound
    window = rolling.window(now=59.5)
    assert window.counts == (0.0, 1.0, 1.0, 2.0, 2.0, 3.0)
    assert window.sum == pytest.approx(3.85)
    # at 60 s slot 0 has left: the window is slots 1..6
    assert rolling.window(now=60.0).counts == (0.0, 0.0, 0.0, 1.0, 1.0, 2.0)
    assert rolling.window(now=109.9).count == 1  # only slot 5 (50-60 s) is left
    assert rolling.window(now=110.0).count == 0
    # reading does not change the window
    assert rolling.window(now=59.5) == window


def test_old_slots_are_dropped_as_new_ones_start() -> None:
    rolling = RollingHistogram(BOUNDS, window_s=10.0, slots=2)
    for t in range(100):
        rolling.observe(0.3, now=float(t))
    assert rolling.window(now=99.0).count == 10  # 90..99
    assert len(rolling._slots) <= 2


def test_p90_follows_histogram_quantile_and_each_pool_shows_its_metric() -> None:
    now = [1000.0]
    recent = RecentLatency(BOUNDS, BOUNDS, clock=lambda: now[0])
    values = [0.05] * 8 + [0.4, 1.5]
    for v in values:
        recent.first_token("prefill", v)
        recent.stream_itl("decode", v / 10)
        recent.first_token("colocated", v)
    expected = CumulativeHistogram((*BOUNDS, float("inf")), (8, 8, 9, 9, 10, 10)).quantile(0.9)
    prefill = recent.p90("prefill")
    assert prefill["ttft_p90_s"] == pytest.approx(expected)
    assert (prefill["ttft_samples"], prefill["itl_p90_s"], prefill["itl_samples"]) == (
        10,
        None,
        None,
    )
    decode = recent.p90("decode")
    assert (decode["ttft_p90_s"], decode["ttft_samples"], decode["itl_samples"]) == (None, None, 10)
    assert decode["itl_p90_s"] is not None and decode["itl_p90_s"] <= 0.2
    colocated = recent.p90("colocated")
    assert colocated["ttft_samples"] == 10 and colocated["itl_samples"] == 0
    assert colocated["itl_p90_s"] is None
    now[0] += 61.0  # a quiet minute later nothing is left
    assert recent.p90("prefill") == {
        "ttft_p90_s": None, "ttft_samples": 0, "itl_p90_s": None, "itl_samples": None
    }  # fmt: skip
