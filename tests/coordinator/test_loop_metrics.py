"""`loop_metrics.py`: the lock-free request-path series expose exactly what prometheus_client's
own `Counter` / `Histogram` do for the same updates (names, labels, `le` strings, cumulative
buckets, count, sum; `_created` only differs by its timestamp)."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from pdorch.app.loop_metrics import LoopCounter, LoopHistogram

BOUNDS = (0.005, 0.01, 0.5, 1, 16, 32)
VALUES = (0.0, 0.005, 0.0051, 0.3, 1, 1.5, 16, 17, 32, 33, 1e9, 4)


def _text(registry: CollectorRegistry) -> str:
    text = generate_latest(registry).decode()
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text)


def test_loop_series_expose_what_prometheus_client_exposes() -> None:
    ours, theirs = CollectorRegistry(auto_describe=False), CollectorRegistry(auto_describe=False)
    counter = LoopCounter("t_requests", "Requests.", ["endpoint", "status"])
    histogram = LoopHistogram("t_seconds", "Seconds.", ["route"], buckets=BOUNDS)
    ours.register(counter)
    ours.register(histogram)
    ref_counter = Counter("t_requests", "Requests.", ["endpoint", "status"], registry=theirs)
    ref_histogram = Histogram("t_seconds", "Seconds.", ["route"], buckets=BOUNDS, registry=theirs)
    for labels in (("chat", "200"), ("completions", "503")):
        counter.labels(*labels)
        ref_counter.labels(*labels)
    counter.labels("chat", "200").inc()
    ref_counter.labels("chat", "200").inc()
    counter.labels("chat", "200").inc(2)
    ref_counter.labels("chat", "200").inc(2)
    histogram.labels("empty")
    ref_histogram.labels("empty")
    for value in VALUES:
        histogram.labels("pd").observe(value)
        ref_histogram.labels("pd").observe(value)
    text = _text(ours)
    assert text == _text(theirs)
    # the check has teeth: the text holds the updates
    assert 't_requests_total{endpoint="chat",status="200"} 3.0' in text
    assert 't_seconds_bucket{le="0.005",route="pd"} 2.0' in text
    assert 't_seconds_bucket{le="+Inf",route="pd"} 12.0' in text
    assert 't_seconds_count{route="empty"} 0.0' in text
