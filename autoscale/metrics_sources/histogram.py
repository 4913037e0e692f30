"""Cumulative Prometheus histograms: window differences, sums and percentiles (one helper).

Every source that reads histogram buckets itself (`CoordinatorSource`, `EngineScrapeSource`)
goes through `CumulativeHistogram`; `PrometheusSource` lets Prometheus's `histogram_quantile`
do the same computation server-side. `quantile` follows the same rule as PromQL's
`histogram_quantile`, so both agree on the same counts:

    rank = q · N                                  (N = count of the +Inf bucket)
    b    = the first bucket whose cumulative count ≥ rank
    value = lo_b + (hi_b - lo_b) · (rank - C_{b-1}) / (C_b - C_{b-1})

with `lo_b` the previous bucket's upper bound (0 for the first bucket, whose upper bound is
returned as is when it is ≤ 0), i.e. observations are taken as spread uniformly inside their
bucket. A rank that falls in the +Inf bucket returns the highest finite bound (nothing better
is known). No observation (N = 0) gives None. The result is exact to within one bucket: the
resolution of a percentile is the width of the bucket it lands in.

A window is `later.minus(earlier)`: bucket-wise differences of two reads of the same series.
If any count went down (the process restarted) the later read alone is the window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from autoscale.signals import LatencySummary

INF = math.inf


@dataclass(frozen=True, slots=True)
class CumulativeHistogram:
    """One histogram: ascending upper bounds (the last is +Inf) and cumulative counts."""

    bounds: tuple[float, ...] = ()
    counts: tuple[float, ...] = ()
    sum: float = 0.0

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.counts):
            raise ValueError("bounds and counts differ in length")
        if self.bounds and self.bounds[-1] != INF:
            raise ValueError("the last bucket must be +Inf")
        if any(a >= b for a, b in zip(self.bounds, self.bounds[1:], strict=False)):
            raise ValueError("bucket bounds must be strictly ascending")

    @classmethod
    def from_buckets(cls, buckets: Mapping[float, float], sum_: float = 0.0) -> CumulativeHistogram:
        """From `{le: cumulative count}` (an `le="+Inf"` bucket is added from the top if absent)."""
        bounds = sorted(buckets)
        counts = [buckets[b] for b in bounds]
        if not bounds or bounds[-1] != INF:
            bounds.append(INF)
            counts.append(counts[-1] if counts else 0.0)
        return cls(tuple(bounds), tuple(counts), sum_)

    @property
    def count(self) -> float:
        return self.counts[-1] if self.counts else 0.0

    def plus(self, other: CumulativeHistogram) -> CumulativeHistogram:
        """The bucket-wise sum (`sum by (le)`); both must have the same bounds (or be empty)."""
        if not self.bounds:
            return other
        if not other.bounds:
            return self
        if self.bounds != other.bounds:
            raise ValueError("cannot add histograms with different buckets")
        counts = tuple(a + b for a, b in zip(self.counts, other.counts, strict=True))
        return CumulativeHistogram(self.bounds, counts, self.sum + other.sum)

    def minus(self, earlier: CumulativeHistogram | None) -> CumulativeHistogram:
        """What was observed between `earlier` and this read (see the module docstring)."""
        if earlier is None or not earlier.bounds:
            return self
        if earlier.bounds != self.bounds or any(
            a < b for a, b in zip(self.counts, earlier.counts, strict=True)
        ):
            return self  # reset or re-bucketed: only the later read is known
        counts = tuple(a - b for a, b in zip(self.counts, earlier.counts, strict=True))
        return CumulativeHistogram(self.bounds, counts, self.sum - earlier.sum)

    def quantile(self, q: float) -> float | None:
        """The `q`-quantile (0 ≤ q ≤ 1) by the rule of the module docstring; None if empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q} outside [0, 1]")
        total = self.count
        if total <= 0 or len(self.bounds) < 2:
            return None
        rank = q * total
        b = next(i for i, c in enumerate(self.counts) if c >= rank)
        if self.bounds[b] == INF:
            return self.bounds[-2]
        if b == 0 and self.bounds[0] <= 0:
            return self.bounds[0]
        lo = 0.0 if b == 0 else self.bounds[b - 1]
        below = 0.0 if b == 0 else self.counts[b - 1]
        inside = self.counts[b] - below
        if inside <= 0:
            return lo
        return lo + (self.bounds[b] - lo) * (rank - below) / inside

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def summary(self) -> LatencySummary:
        """p50 / p90 / p99 / mean and the count, as a planner reads them."""
        return LatencySummary(
            count=round(self.count),
            p50_s=self.quantile(0.5),
            p90_s=self.quantile(0.9),
            p99_s=self.quantile(0.99),
            mean_s=self.mean,
        )


def total(histograms: Iterable[CumulativeHistogram]) -> CumulativeHistogram:
    """`sum by (le)` over several series of one metric."""
    out = CumulativeHistogram()
    for h in histograms:
        out = out.plus(h)
    return out
