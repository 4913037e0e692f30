"""Prometheus text pages (`/metrics`) → samples, and the sums a source needs from them.

`parse_page(text, families)` keeps only the named metric families (`pools.prometheus_text`, the
filter the fleet's scraper shares) and hands them to prometheus_client's parser.
`Page` answers the two questions every source asks: the sum of a counter/gauge over the series
matching some labels (grouped by some labels), and the same for a histogram, as
`CumulativeHistogram`s (`sum by (le)` across the matched series).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from autoscale.metrics_sources.histogram import INF, CumulativeHistogram
from pools.prometheus_text import relevant_lines


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def parse_page(text: str, families: Collection[str]) -> Page:
    """The samples of `families` (names without `_total`/`_bucket`/...) on a metrics page.

    Raises ValueError if the page is not Prometheus text.
    """
    from prometheus_client.parser import text_string_to_metric_families

    samples = [
        Sample(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(relevant_lines(text, families))
        for s in family.samples
    ]
    return Page(samples)


def _matches(labels: Mapping[str, str], where: Mapping[str, str] | None) -> bool:
    return where is None or all(labels.get(k) == v for k, v in where.items())


@dataclass(frozen=True, slots=True)
class Page:
    """The parsed samples of one page (or several pages' samples concatenated)."""

    samples: list[Sample]

    def __add__(self, other: Page) -> Page:
        return Page(self.samples + other.samples)

    def value(self, name: str, where: Mapping[str, str] | None = None) -> float:
        """Σ of the samples named `name` (the full sample name, e.g. `x_total`) matching."""
        return sum(s.value for s in self.samples if s.name == name and _matches(s.labels, where))

    def values(
        self, name: str, by: tuple[str, ...], where: Mapping[str, str] | None = None
    ) -> dict[tuple[str, ...], float]:
        """`sum by (by)` of the samples named `name`."""
        out: dict[tuple[str, ...], float] = defaultdict(float)
        for s in self.samples:
            if s.name == name and _matches(s.labels, where):
                out[tuple(s.labels.get(k, "") for k in by)] += s.value
        return dict(out)

    def histograms(
        self, family: str, by: tuple[str, ...] = (), where: Mapping[str, str] | None = None
    ) -> dict[tuple[str, ...], CumulativeHistogram]:
        """`sum by (le, by)` of histogram `family`, one `CumulativeHistogram` per group."""
        buckets: dict[tuple[str, ...], dict[float, float]] = defaultdict(lambda: defaultdict(float))
        sums: dict[tuple[str, ...], float] = defaultdict(float)
        for s in self.samples:
            if not _matches(s.labels, where):
                continue
            key = tuple(s.labels.get(k, "") for k in by)
            if s.name == family + "_bucket":
                le = s.labels.get("le", "+Inf")
                buckets[key][INF if le in ("+Inf", "Inf") else float(le)] += s.value
            elif s.name == family + "_sum":
                sums[key] += s.value
        return {
            key: CumulativeHistogram.from_buckets(b, sums.get(key, 0.0))
            for key, b in buckets.items()
        }

    def histogram(self, family: str, where: Mapping[str, str] | None = None) -> CumulativeHistogram:
        """All matching series of `family` summed by `le` (empty when none)."""
        return self.histograms(family, (), where).get((), CumulativeHistogram())


__all__ = ["Page", "Sample", "parse_page"]
