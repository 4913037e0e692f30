"""Counters and histograms of the request path, updated without prometheus_client's locks.

A whole answer updates six series (`metrics.py`: `answered`, `decode_first_byte`, `routed`,
`completed`). prometheus_client's `Counter.inc` takes a lock per update and
`Histogram.observe` two (its sum and one bucket, found by a linear scan of the bounds):
5.4 µs for the six in the quiet-lane microbenchmark, 1.4 µs here (proxy-lean-5,
`benchmarks/results/proxy.md`; ~1 % of a whole answer's proxy CPU on a calm box).
These series are updated only on the coordinator's event loop and read when `/metrics` is
rendered on the same loop, so an update needs no lock: a counter is an int add, a histogram
observation a `bisect` for its bucket, an int add and a float add.

The exposition is prometheus_client's, sample for sample, through its own metric families:
`<name>_total` and `<name>_created` for a counter; `<name>_bucket` (cumulative, the same `le`
strings), `_count`, `_sum` and `_created` for a histogram; children made on first use, at 0
(`tests/coordinator/test_loop_metrics.py` checks the text against prometheus_client's for the
same updates). A bucket holds the values `<=` its bound, as prometheus_client's.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import cast

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

# prometheus_client's own `le` formatting (Go's float format), typed
_go_float = cast(Callable[[float], str], floatToGoString)


class LoopCounterChild:
    """One labelled counter series (`LoopCounter.labels`)."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class LoopHistogramChild:
    """One labelled histogram series (`LoopHistogram.labels`): per-bucket counts (not
    cumulative; the last one is `+Inf`) and the sum."""

    __slots__ = ("_bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self._bounds, amount)] += 1
        self.sum += amount


class _Family(Collector):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)


class LoopCounter(_Family):
    """A labelled counter for the event loop's thread only (module docstring)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        super().__init__(name, documentation, labelnames)
        self._children: dict[tuple[str, ...], LoopCounterChild] = {}

    def labels(self, *values: str) -> LoopCounterChild:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = LoopCounterChild()
        return child

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._children.items():
            family.add_metric(list(values), child.value, created=child.created)
        yield family


class LoopHistogram(_Family):
    """A labelled histogram for the event loop's thread only (module docstring)."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        super().__init__(name, documentation, labelnames)
        self._bounds = tuple(float(b) for b in buckets)
        self._le = [_go_float(b) for b in self._bounds] + ["+Inf"]
        self._children: dict[tuple[str, ...], LoopHistogramChild] = {}

    def labels(self, *values: str) -> LoopHistogramChild:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = LoopHistogramChild(self._bounds)
        return child

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._children.items():
            total = 0
            buckets: list[tuple[str, float]] = []
            for le, count in zip(self._le, child.counts, strict=True):
                total += count
                buckets.append((le, float(total)))
            family.add_metric(list(values), buckets, child.sum)
            labels = dict(zip(self.labelnames, values, strict=True))
            family.samples.append(Sample(f"{self.name}_created", labels, child.created))
        yield family
