"""Pure parts of the metrics sources: /admin/pools → pools and targets, file_sd entries,
the PromQL they send, the priming call of a differencing source."""

from __future__ import annotations

from typing import Any

from autoscale.metrics_sources.coordinator import (
    CoordinatorRead,
    coordinator_observation,
    engine_targets,
    pool_status,
)
from autoscale.metrics_sources.exposition import Page
from autoscale.metrics_sources.histogram import INF, CumulativeHistogram
from autoscale.metrics_sources.prometheus import PrometheusSource, prometheus_observation
from autoscale.metrics_sources.prometheus_targets import file_sd_targets
from autoscale.signals import Pool, PoolStatus


def row(rid: str, state: str, routable: bool, port: int) -> dict[str, Any]:
    return {
        "id": rid,
        "url": f"http://127.0.0.1:{port}",
        "metrics_url": f"http://127.0.0.1:{port}/metrics",
        "state": state,
        "routable": routable,
    }


VIEW = {
    "pools": {
        "prefill": {"replicas": [row("p0", "healthy", True, 1), row("p1", "pending", False, 2)]},
        "decode": {
            "replicas": [
                row("d0", "healthy", True, 3),
                row("d1", "draining", False, 4),
                row("d2", "unhealthy", False, 5),
            ]
        },
        "colocated": {"replicas": [row("c0", "healthy", True, 6)]},
    }
}


def test_pool_status_counts_states() -> None:
    assert pool_status(VIEW) == {
        Pool.PREFILL: PoolStatus(ready=1, pending=1, draining=0),
        Pool.DECODE: PoolStatus(ready=1, pending=0, draining=1),
    }


def test_engine_targets_skip_unhealthy_and_other_pools() -> None:
    ids = [(t.replica_id, t.pool) for t in engine_targets(VIEW)]
    assert ids == [
        ("p0", Pool.PREFILL),
        ("p1", Pool.PREFILL),
        ("d0", Pool.DECODE),
        ("d1", Pool.DECODE),
    ]


def test_file_sd_has_pool_and_replica_labels() -> None:
    entries = file_sd_targets(VIEW)
    assert len(entries) == 6
    first = next(e for e in entries if e["labels"]["replica"] == "d1")
    assert first == {
        "targets": ["127.0.0.1:4"],
        "labels": {
            "pool": "decode",
            "replica": "d1",
            "__metrics_path__": "/metrics",
            "__scheme__": "http",
        },
    }


def test_priming_call_has_no_load() -> None:
    h = CumulativeHistogram((0.1, INF), (3, 4), 1.0)
    read = CoordinatorRead(h, h, h, h)
    pools = {Pool.DECODE: PoolStatus(ready=2)}
    obs = coordinator_observation(5.0, 0.0, None, pools, (), 0.0)
    assert obs.window_s == 0 and obs.num_requests == 0 and obs.ttft.count == 0
    assert obs.pools == pools
    later = CoordinatorRead(*(CumulativeHistogram((0.1, INF), (5, 8), 3.0),) * 4)
    obs = coordinator_observation(7.0, 2.0, later.minus(read), pools, (), 0.0)
    assert obs.num_requests == 4 and obs.arrival_rps == 2.0
    assert obs.mean_isl_tokens == 0.5 and obs.ttft.count == 4
    assert obs.ttft.p50_s == 0.1  # rank 2 of 4: the top of the first bucket (2 in it)


def test_promql_names_the_pool_labels_and_window() -> None:
    source = PrometheusSource("http://prom:9090", window_s=30, latency="engines")
    q = source.queries()
    assert q["ttft_p90"] == (
        "histogram_quantile(0.9, sum by (le) "
        '(rate(vllm:time_to_first_token_seconds_bucket{pool="prefill"}[30000ms])))'
    )
    assert 'vllm:inter_token_latency_seconds_bucket{pool="decode"}' in q["itl_p99"]
    assert q["arrival_rps"] == "sum(rate(pdorch_request_prompt_tokens_count[30000ms]))"
    matched = PrometheusSource("http://prom:9090", matchers='fleet="a"').queries()
    assert 'pdorch_time_to_first_token_seconds_bucket{fleet="a"}' in matched["ttft_p50"]


def test_prometheus_answers_to_observation() -> None:
    queries = PrometheusSource("http://prom:9090").queries()
    results: dict[str, list[tuple[dict[str, str], float]]] = {k: [] for k in queries}
    results["arrivals"] = [({}, 12.0)]
    results["arrival_rps"] = [({}, 0.2)]
    results["ttft_count"] = [({}, 12.0)]
    results["ttft_p90"] = [({}, 0.5)]
    results["ttft_mean"] = [({}, float("nan"))]
    results["kv_usage"] = [({"pool": "decode", "replica": "d0"}, 0.25)]
    results["running"] = [({"pool": "decode", "replica": "d0"}, 3.0)]
    results["engines_up"] = [({"pool": "decode"}, 2.0), ({"pool": "prefill"}, 1.0)]
    obs = prometheus_observation(1.0, 60.0, results)
    assert obs.num_requests == 12 and obs.arrival_rps == 0.2
    assert obs.ttft.p90_s == 0.5 and obs.ttft.mean_s is None and obs.itl.count == 0
    assert obs.pools == {Pool.DECODE: PoolStatus(ready=2), Pool.PREFILL: PoolStatus(ready=1)}
    (replica,) = obs.replicas
    assert (replica.replica_id, replica.kv_usage, replica.num_running) == ("d0", 0.25, 3)
    results["pool_replicas"] = [
        ({"pool": "decode", "state": "ready"}, 2.0),
        ({"pool": "decode", "state": "draining"}, 1.0),
    ]
    assert prometheus_observation(1.0, 60.0, results).pools == {
        Pool.DECODE: PoolStatus(ready=2, draining=1)
    }


def test_empty_page_reads_as_nothing() -> None:
    assert Page([]).histogram("x").count == 0
