"""`CumulativeHistogram`: percentiles from cumulative buckets, hand-computed cases."""

from __future__ import annotations

import math

import pytest

from autoscale.metrics_sources.exposition import parse_page
from autoscale.metrics_sources.histogram import INF, CumulativeHistogram, total


def hist(
    counts: tuple[float, ...], bounds: tuple[float, ...] = (0.1, 0.5, 1.0, INF)
) -> CumulativeHistogram:
    return CumulativeHistogram(bounds, counts, 0.0)


def test_quantile_interpolates_inside_the_bucket() -> None:
    h = hist((2, 6, 10, 10))
    # rank 5 lands in (0.1, 0.5]: 3 of its 4 observations below → 0.1 + 0.4 * 3/4
    assert h.quantile(0.5) == pytest.approx(0.4)
    # rank 9 in (0.5, 1]: 0.5 + 0.5 * 3/4
    assert h.quantile(0.9) == pytest.approx(0.875)
    # rank 1 in the first bucket, whose lower bound is 0: 0.1 * 1/2
    assert h.quantile(0.1) == pytest.approx(0.05)
    assert h.quantile(1.0) == pytest.approx(1.0)


def test_rank_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    h = hist((1, 1, 1, 4))
    assert h.quantile(0.9) == 1.0
    assert h.quantile(0.25) == pytest.approx(0.1)


def test_empty_histogram_has_no_quantile() -> None:
    assert hist((0, 0, 0, 0)).quantile(0.9) is None
    assert CumulativeHistogram().quantile(0.5) is None
    assert CumulativeHistogram().summary().p90_s is None


def test_empty_buckets_between_are_skipped() -> None:
    # 5 below 0.1, nothing in (0.1, 0.5], 5 in (0.5, 1]: the median is the top of bucket 0
    h = hist((5, 5, 10, 10))
    assert h.quantile(0.5) == pytest.approx(0.1)
    assert h.quantile(0.6) == pytest.approx(0.5 + 0.5 * 1 / 5)


def test_window_is_the_difference_of_two_reads() -> None:
    earlier = CumulativeHistogram((0.1, 0.5, 1.0, INF), (2, 6, 10, 10), 5.0)
    later = CumulativeHistogram((0.1, 0.5, 1.0, INF), (2, 7, 14, 15), 12.5)
    window = later.minus(earlier)
    assert window.counts == (0, 1, 4, 5)
    assert window.count == 5
    assert window.mean == pytest.approx(7.5 / 5)
    assert window.quantile(0.5) == pytest.approx(0.5 + 0.5 * 1.5 / 3)
    assert window.quantile(0.99) == 1.0  # in +Inf


def test_a_reset_counter_keeps_the_later_read() -> None:
    earlier = hist((5, 5, 10, 10))
    later = hist((1, 2, 3, 3))
    assert later.minus(earlier) == later
    assert later.minus(None) == later


def test_summary_and_sum_by_le() -> None:
    a = CumulativeHistogram((0.1, 0.5, 1.0, INF), (2, 6, 10, 10), 5.0)
    b = CumulativeHistogram((0.1, 0.5, 1.0, INF), (0, 0, 0, 0), 0.0)
    s = total([a, b]).summary()
    assert s.count == 10
    assert s.p50_s == pytest.approx(0.4)
    assert s.p90_s == pytest.approx(0.875)
    assert s.p99_s == pytest.approx(0.5 + 0.5 * 3.9 / 4)
    assert s.mean_s == pytest.approx(0.5)
    with pytest.raises(ValueError, match="different buckets"):
        a.plus(hist((1, 1, 1), (0.2, 1.0, INF)))


def test_bad_buckets_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\+Inf"):
        CumulativeHistogram((0.1, 0.5), (1, 2))
    with pytest.raises(ValueError, match="ascending"):
        CumulativeHistogram((0.5, 0.1, INF), (1, 2, 2))
    assert CumulativeHistogram.from_buckets({0.5: 1, 0.1: 0}).bounds == (0.1, 0.5, INF)
    assert math.isinf(CumulativeHistogram.from_buckets({}).bounds[-1])


PAGE = """\
# HELP x_seconds A histogram.
# TYPE x_seconds histogram
x_seconds_bucket{pool="prefill",replica="p0",le="0.1"} 1.0
x_seconds_bucket{pool="prefill",replica="p0",le="1.0"} 3.0
x_seconds_bucket{pool="prefill",replica="p0",le="+Inf"} 4.0
x_seconds_sum{pool="prefill",replica="p0"} 6.0
x_seconds_count{pool="prefill",replica="p0"} 4.0
x_seconds_bucket{pool="decode",replica="d0",le="0.1"} 1.0
x_seconds_bucket{pool="decode",replica="d0",le="1.0"} 1.0
x_seconds_bucket{pool="decode",replica="d0",le="+Inf"} 1.0
x_seconds_sum{pool="decode",replica="d0"} 0.05
x_seconds_count{pool="decode",replica="d0"} 1.0
# HELP y_total A counter.
# TYPE y_total counter
y_total{pool="decode"} 7.0
# HELP ignored_total Not asked for.
# TYPE ignored_total counter
ignored_total 3.0
"""


def test_page_sums_histograms_by_le_and_filters_families() -> None:
    page = parse_page(PAGE, ["x_seconds", "y"])
    both = page.histogram("x_seconds")
    assert both.counts == (2, 4, 5)
    assert both.sum == pytest.approx(6.05)
    assert page.histogram("x_seconds", {"pool": "decode"}).count == 1
    per_pool = page.histograms("x_seconds", ("pool",))
    assert set(per_pool) == {("prefill",), ("decode",)}
    assert page.value("y_total") == 7
    assert page.value("ignored_total") == 0
