"""The PromQL metric-name extractor the dashboard test relies on."""

from __future__ import annotations

from tests.deploy.promql import exposed_names, metric_names


def test_names_functions_matchers_ranges_and_grouping_are_told_apart() -> None:
    expr = (
        "histogram_quantile(0.9, sum by (le, pool) (rate(pdorch_time_to_first_token_seconds_bucket"
        '{pool=~"$pool", route!="x{y}"}[$__rate_interval]))) > 2'
    )
    assert metric_names(expr) == {"pdorch_time_to_first_token_seconds_bucket"}


def test_binary_operations_keep_both_sides_and_drop_keywords() -> None:
    expr = (
        "sum by (pool) (rate(vllm:prefix_cache_hits_total[5m])) / on (pool) group_left "
        "sum by (pool) (rate(vllm:prefix_cache_queries_total[5m] offset 1h)) and bool up"
    )
    assert metric_names(expr) == {
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "up",
    }


def test_numbers_durations_and_grafana_variables_are_not_names() -> None:
    assert metric_names("max by (pool) (pdorch_pool_replicas{state='ready'}) == 0") == {
        "pdorch_pool_replicas"
    }
    assert metric_names("increase(x_total[${interval}]) > 1e3 * 2.5") == {"x_total"}


def test_exposed_names_are_the_series_names() -> None:
    text = (
        '# HELP a_total A.\n# TYPE a_total counter\na_total{x="1"} 3\n'
        'b_bucket{le="+Inf"} 1\nc 2.0\n'
    )
    assert exposed_names(text) == {"a_total", "b_bucket", "c"}
