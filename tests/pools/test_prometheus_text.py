"""`pools.prometheus_text.relevant_lines`: the line filter the metrics readers share."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from pools.prometheus_text import relevant_lines

PAGE = """\
# HELP vllm:num_requests_running Running requests.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 3.0
# HELP vllm:prefix_cache_hits Prefix cache hits, in tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0"} 12.0
vllm:prefix_cache_hits_created{engine="0"} 1.7e9
# HELP vllm:e2e_request_latency_seconds Latency.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="1.0"} 4.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 5.0
vllm:e2e_request_latency_seconds_count 5.0
vllm:e2e_request_latency_seconds_sum 2.5
vllm:num_requests_running_extra 9.0
"""


def test_keeps_only_the_named_families_with_their_suffixes() -> None:
    kept = relevant_lines(PAGE, ["vllm:num_requests_running", "vllm:prefix_cache_hits"])
    assert "e2e_request_latency" not in kept
    assert "_extra" not in kept  # a longer name sharing the prefix is another metric
    samples = {s.name: s.value for f in text_string_to_metric_families(kept) for s in f.samples}
    assert samples == {
        "vllm:num_requests_running": 3.0,
        "vllm:prefix_cache_hits_total": 12.0,
        "vllm:prefix_cache_hits_created": 1.7e9,
    }


def test_nothing_wanted_leaves_an_empty_page() -> None:
    assert relevant_lines(PAGE, []) == ""
