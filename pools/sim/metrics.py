"""vLLM-compatible Prometheus metrics for one simulated engine.

The simulated engine must be scraped by the same code that scrapes real vLLM, so the names,
types, label sets and histogram buckets below are those of vLLM 0.32's `/metrics` (see the real
captures in `tests/fixtures/vllm/metrics_*.txt`): every series carries `engine="0"` and
`model_name=<served name>`, counters are exposed as `<name>_total` with a `<name>_created`
gauge, labels are printed in sorted order.

A deliberately small hand-rolled exposition instead of `prometheus_client`: one engine's
metrics are a handful of floats and lists updated on the request path of hundreds of simulated
replicas in one process, so observing is a few list operations with no locks, and the text is
built only when `/metrics` is scraped.

The engine's own gauges and counters are not kept here: `render` reads them from the core's
`EngineStats` snapshot (`pools/sim/stats.py`, the one set of counters). This object keeps only
what the frontend and the KV transport observe (latency histograms, NIXL transfer metrics,
block verification failures).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping, Sequence

from pools.sim.stats import EngineStats

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TOKEN_COUNT_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)
NIXL_XFER_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(float(2048 * 4**i) for i in range(12))

PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def _fmt(value: float) -> str:
    """Prometheus float formatting as prometheus_client does it (repr, +Inf)."""
    if value == float("inf"):
        return "+Inf"
    return repr(float(value))


class Histogram:
    """Cumulative-bucket histogram: `observe` is one bisect and three adds."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1


class EngineMetrics:
    """The frontend/transport metric state of one engine and the text exposition.

    The runner observes histograms as requests move and the KV transport counts transfers;
    `/metrics` renders them together with the core's `EngineStats`. Field names follow the vLLM
    metric they back.
    """

    def __init__(self, model_name: str, engine: str = "0") -> None:
        self.model_name = model_name
        self.engine = engine
        self.created = time.time()
        # counters
        self.nixl_num_failed_transfers = 0
        self.nixl_num_kv_expired_reqs = 0
        # pdorch-only: blocks whose received bytes did not match their expected content
        self.kv_block_verify_failures = 0
        # histograms
        self.time_to_first_token = Histogram(TTFT_BUCKETS)
        self.inter_token_latency = Histogram(ITL_BUCKETS)
        self.e2e_request_latency = Histogram(REQUEST_LATENCY_BUCKETS)
        self.request_prompt_tokens = Histogram(TOKEN_COUNT_BUCKETS)
        self.request_generation_tokens = Histogram(TOKEN_COUNT_BUCKETS)
        self.nixl_xfer_time = Histogram(NIXL_XFER_TIME_BUCKETS)
        self.nixl_bytes_transferred = Histogram(NIXL_BYTES_BUCKETS)

    def render(self, engine: EngineStats | None = None, *, client_aborts: int = 0) -> str:
        """The Prometheus text exposition (format 0.0.4), vLLM's names and labels.

        `engine`: the core's snapshot (None before the core exists: zeros). `client_aborts`:
        requests the frontend aborted (client gone); vLLM 0.32 counts a request in
        `request_success_total` only when the engine core reports its finish, and a frontend
        abort drops the request's output state first (`OutputProcessor.abort_requests`), so
        `finished_reason="abort"` never counts them.
        """
        base = f'engine="{self.engine}",model_name="{self.model_name}"'
        by_source = dict.fromkeys(PROMPT_SOURCES, 0)
        success = dict.fromkeys(FINISHED_REASONS, 0)
        running = waiting = 0
        usage = 0.0
        queries = hits = ext_queries = ext_hits = preemptions = prompt = generation = 0
        if engine is not None:
            running, waiting, usage = engine.num_running, engine.num_waiting, engine.kv_cache_usage
            queries, hits = engine.prefix_cache_queries, engine.prefix_cache_hits
            ext_queries = engine.external_prefix_cache_queries
            ext_hits = engine.external_prefix_cache_hits
            preemptions = engine.num_preemptions
            prompt, generation = engine.prompt_tokens, engine.generation_tokens
            by_source.update(engine.prompt_tokens_by_source)
            success.update(engine.request_success)
        success["abort"] = max(0, success["abort"] - client_aborts)
        out: list[str] = []

        def header(name: str, kind: str, help_text: str) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")

        def gauge(name: str, help_text: str, value: float) -> None:
            header(name, "gauge", help_text)
            out.append(f"{name}{{{base}}} {_fmt(value)}")

        def counter(
            name: str, help_text: str, values: Mapping[str, float] | float, label: str = ""
        ) -> None:
            header(f"{name}_total", "counter", help_text)
            if isinstance(values, Mapping):
                for key, value in values.items():
                    labels = _labels(base, label, key)
                    out.append(f"{name}_total{{{labels}}} {_fmt(value)}")
            else:
                out.append(f"{name}_total{{{base}}} {_fmt(values)}")
            header(f"{name}_created", "gauge", help_text)
            created_labels = (
                [_labels(base, label, key) for key in values]
                if isinstance(values, Mapping)
                else [base]
            )
            for labels in created_labels:
                out.append(f"{name}_created{{{labels}}} {_fmt(self.created)}")

        def histogram(name: str, help_text: str, hist: Histogram) -> None:
            header(name, "histogram", help_text)
            cumulative = 0
            for bound, n in zip((*hist.bounds, float("inf")), hist.counts, strict=True):
                cumulative += n
                labels = _labels(base, "le", _fmt(bound))
                out.append(f"{name}_bucket{{{labels}}} {_fmt(cumulative)}")
            out.append(f"{name}_count{{{base}}} {_fmt(hist.count)}")
            out.append(f"{name}_sum{{{base}}} {_fmt(hist.sum)}")
            header(f"{name}_created", "gauge", help_text)
            out.append(f"{name}_created{{{base}}} {_fmt(self.created)}")

        gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            running,
        )
        gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            waiting,
        )
        gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            usage,
        )
        counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            queries,
        )
        counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            hits,
        )
        counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, "
            "in terms of number of queried tokens.",
            ext_queries,
        )
        counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, "
            "in terms of number of cached tokens.",
            ext_hits,
        )
        counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            preemptions,
        )
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", prompt)
        counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            by_source,
            label="source",
        )
        counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            generation,
        )
        counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            success,
            label="finished_reason",
        )
        histogram(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            self.request_prompt_tokens,
        )
        histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            self.request_generation_tokens,
        )
        histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            self.time_to_first_token,
        )
        histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            self.inter_token_latency,
        )
        histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            self.e2e_request_latency,
        )
        histogram(
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            self.nixl_xfer_time,
        )
        histogram(
            "vllm:nixl_bytes_transferred",
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
            self.nixl_bytes_transferred,
        )
        counter(
            "vllm:nixl_num_failed_transfers",
            "Number of failed NIXL KV Cache transfers, including handshake and notification "
            "failures.",
            self.nixl_num_failed_transfers,
        )
        counter(
            "vllm:nixl_num_kv_expired_reqs",
            "Number of requests that had their KV expire. NOTE: This metric is tracked on the "
            "P instance.",
            self.nixl_num_kv_expired_reqs,
        )
        counter(
            "pdorch_sim:kv_block_verify_failures",
            "Received KV blocks whose bytes did not match the content expected for their "
            "token prefix (simulated engine only).",
            self.kv_block_verify_failures,
        )
        out.append("")
        return "\n".join(out)


def _labels(base: str, name: str, value: str) -> str:
    """`base` plus one label, keeping vLLM's sorted label order (engine < x < model_name)."""
    if name < "model_name":
        head, _, tail = base.partition(",model_name=")
        return f'{head},{name}="{value}",model_name={tail}'
    return f'{base},{name}="{value}"'
