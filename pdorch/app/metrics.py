"""The coordinator's own Prometheus metrics (`GET /metrics`), one registry per coordinator.

Counters and histograms are updated on the request path (one labelled increment each; the
six series every answer updates, `pdorch_requests_total`, `pdorch_routes_total`, the duration,
first-byte and token histograms, without prometheus_client's locks: `loop_metrics.py`);
per-replica gauges (health, token load, KV usage) are read from the coordinator's state when
`/metrics` is scraped, so they cost nothing per request.

Metrics (type; labels):
- `pdorch_requests_total` (counter; `endpoint` completions|chat, `status` HTTP code)
- `pdorch_routes_total` (counter; `route`: `pd` disaggregated, `local` decode prefilled,
  `colocated`, `fallback` prefill failed so decode prefilled)
- `pdorch_prefill_failures_total` (counter; `kind`: connection, timeout, http_5xx, bad_answer)
- `pdorch_decode_first_byte_failures_total` (counter; `why`: `deadline` no first byte within
  `first_byte_timeout_s`, `unhealthy` the health checker ejected the replica meanwhile): decode
  legs hung up before their first byte and retried on another replica
- `pdorch_decode_retries_total`, `pdorch_stream_errors_total` (streams ended with an error
  event), `pdorch_client_disconnects_total` (counters)
- `pdorch_rejected_total` (counter; `reason`: concurrency (over `max_concurrent_requests`
  with the admission queue full or off), displaced (queued, then its place taken by a
  higher priority), queue_timeout (queued past `admission.max_wait_s`),
  body_size, auth; at the request head, before admission (`head_shed.py`): loop_lag (the
  event loop ran past `head_shed.max_lag_s` late), pending (`head_shed.max_pending_requests`
  heads waited for their handler))
- `pdorch_event_loop_lag_seconds` (gauge): how late the loop ran its last lag probe
- KV-event replays (`router/kv_event_subscriber.py`; a restarted coordinator's join replays
  are what `/health` `replaying` waits for): `pdorch_kv_replay_duration_seconds` (histogram;
  `outcome` completed|failed|cancelled), and of each replica's last one
  `pdorch_kv_replay_last_seconds` (gauge; `replica`, `outcome`, `join` true|false) and
  `pdorch_kv_replay_last_blocks` (gauge; `replica`: the blocks it stored)
- `pdorch_migrations_total` (counter; `reason`: `connection` reset/refused/timed out, `eof`
  the answer ended before `[DONE]`, `stall` no byte for `stall_timeout_s`, `error_event` the
  engine ended the stream with an in-band error event, e.g. on SIGTERM): requests continued
  on another decode replica (`migration.py`); `pdorch_migrations_refused_total` (counter;
  `why`: `limit` (`migration_limit` reached), `no_replica`, `not_migratable` (n > 1, tools,
  structured output, ...)): mid-answer failures that ended with an error event instead
- `pdorch_request_duration_seconds`, `pdorch_first_byte_seconds` (histograms; `endpoint`)
- `pdorch_requests_in_flight` (gauge)
- planner inputs (`autoscale/metrics_sources/`; labels `pool`, `replica` = the replica's pool
  and id, series created at 0 for every replica at each scrape so `rate()` sees the first
  request):
  - `pdorch_time_to_first_token_seconds` (histogram; `pool`, `replica` of the replica that
    computed the prompt: the prefill replica, or the decode replica on `local`/`fallback`):
    streamed requests only, request arrival to the client's first byte
  - `pdorch_inter_token_latency_seconds` (histogram; `pool`, `replica` of the decode
    replica): one observation per completed stream, its *mean* gap between token events
    ((last - first event time) / events after the first chunk), the per-request mean ITL the
    planner sizes decode against; no per-token work beyond the counting the stream already did
  - both also kept per pool over the last 60 s (`recent_latency.py`): the observed p90s of
    `GET /admin/autoscale` when no autoscaler reports them
  - `pdorch_request_prompt_tokens` (histogram; `route`): prompt tokens of each routed request
    (the coordinator's tokenization, or chars/4 without a tokenizer), observed when it is
    routed; its `_count` is the arrivals, `_sum/_count` the mean ISL
  - `pdorch_request_generation_tokens` (histogram; `route`): output tokens of each completed
    request (streams: SSE events less `[DONE]`, chat's role event and the usage event;
    whole answers: `usage.completion_tokens`); `_sum/_count` the mean OSL
  - requests by route: `pdorch_routes_total`; queue per replica:
    `pdorch_replica_requests_in_flight`; cached prompt tokens are not known to the
    coordinator (its index predicts, the engine decides): the hit rate comes from the
    engines' `vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`
- `pdorch_replica_healthy`, `pdorch_replica_prefill_tokens_queued`,
  `pdorch_replica_decode_blocks`, `pdorch_replica_requests_in_flight`,
  `pdorch_replica_kv_usage` (gauges; `pool`, `replica`)
- several coordinators (only with a `sync:` section; `pdorch/SYNC.md`): `pdorch_sync_peers`
  (gauge: peer coordinators heard from and not expired) and one counter per
  `PeerSyncStats` field, `pdorch_sync_<field>_total`: `messages_sent`, `entries_sent` (deltas
  sent), `snapshots_sent`, `messages_received`, `entries_received`, `entries_applied` (deltas
  that changed this coordinator's view), `own_messages_ignored`, `bad_messages`, `seq_gaps`,
  `entries_forgotten` (peer entries dropped: bye, expiry, restart, snapshot repair),
  `peers_expired`
- scaling (`scaling.py`, `admin_scale.py`): `pdorch_pool_replicas` (gauge; `pool`, `state`
  ready|pending|draining), `pdorch_autoscale_desired` (gauge; `pool`: the last count asked
  for, by an operator or the autoscaler), `pdorch_autoscale_decisions_total` (counter;
  `pool`, `reason`: the autoscaler's decisions by the term that bound them, `pinned` when a
  manual pin kept it from applying), `pdorch_drain_duration_seconds` (histogram; `pool`,
  `outcome` drained|timed_out), `pdorch_replica_ready_seconds` (histogram; `pool`: start to
  joining routing), `pdorch_role_switches_total` (counter; `from_pool`, `to_pool`),
  `pdorch_recalls_total` (counter; `pool`: draining replicas a scale-up took back instead of
  a cold start), `pdorch_drain_moves_total` (counter; `from_pool`, `to_pool`: draining
  replicas a scale-up of the other pool moved there; `autoscale.actuators.recall`)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from pdorch.app.loop_metrics import (
    LoopCounter,
    LoopCounterChild,
    LoopHistogram,
    LoopHistogramChild,
)
from pdorch.app.metrics_state import StateCollector
from pdorch.app.recent_latency import RecentLatency
from router.kv_event_subscriber import ReplayRecord

if TYPE_CHECKING:
    from pdorch.app.state import Coordinator

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# finer than _LATENCY_BUCKETS where SLOs sit (TTFT 0.1-5 s, ITL 10-100 ms): a percentile is
# only known to within the bucket it falls in
_TTFT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
    1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
)  # fmt: skip
_TOKEN_BUCKETS = (
    16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072,
)  # fmt: skip
_ROUTES = ("pd", "local", "colocated", "fallback")
_ENDPOINTS = ("completions", "chat")


class CoordinatorMetrics:
    """The metric objects of one coordinator (see the module docstring)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        # the request path's series: updated on the loop without locks (loop_metrics.py)
        self.requests = LoopCounter(
            "pdorch_requests", "Client requests answered.", ["endpoint", "status"]
        )
        r.register(self.requests)
        self.routes = LoopCounter("pdorch_routes", "Requests by route taken.", ["route"])
        r.register(self.routes)
        self.prefill_failures = Counter(
            "pdorch_prefill_failures",
            "Prefill legs that failed (the decode replica then prefilled locally).",
            ["kind"],
            registry=r,
        )
        self.decode_retries = Counter(
            "pdorch_decode_retries", "Decode legs retried on another replica.", registry=r
        )
        self.first_byte_failures = Counter(
            "pdorch_decode_first_byte_failures",
            "Decode legs hung up before their first byte (then retried elsewhere).",
            ["why"],
            registry=r,
        )
        for why in ("deadline", "unhealthy"):
            self.first_byte_failures.labels(why)
        self.stream_errors = Counter(
            "pdorch_stream_errors",
            "Streams that ended with an error event after their first byte.",
            registry=r,
        )
        self.disconnects = Counter(
            "pdorch_client_disconnects", "Clients that left before the answer ended.", registry=r
        )
        self.migrations = Counter(
            "pdorch_migrations",
            "Requests continued on another decode replica after theirs failed mid-answer "
            "(migration.py).",
            ["reason"],
            registry=r,
        )
        self.migrations_refused = Counter(
            "pdorch_migrations_refused",
            "Mid-answer decode failures that could not be continued (the stream ended with an "
            "error event).",
            ["why"],
            registry=r,
        )
        for reason in ("connection", "eof", "stall", "error_event"):
            self.migrations.labels(reason)
        for why in ("limit", "no_replica", "not_migratable"):
            self.migrations_refused.labels(why)
        self._rejected = Counter(
            "pdorch_rejected", "Requests refused at admission.", ["reason"], registry=r
        )
        self.replay_duration = Histogram(
            "pdorch_kv_replay_duration_seconds",
            "KV-event replays by outcome: seconds from the request to the end.",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        for outcome in ("completed", "failed", "cancelled"):
            self.replay_duration.labels(outcome)
        # the subscriber exists before the metrics (state.py) and tells each ended replay
        coordinator.subscriber.on_replay_end = self.replay_ended
        self.loop_lag = Gauge(
            "pdorch_event_loop_lag_seconds",
            "How late the coordinator's event loop ran its last lag probe (head_shed.py).",
            registry=r,
        )
        self.duration = LoopHistogram(
            "pdorch_request_duration_seconds",
            "Seconds from request to the last byte.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
        )
        r.register(self.duration)
        self.first_byte = LoopHistogram(
            "pdorch_first_byte_seconds",
            "Seconds from request to the decode leg's first byte.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
        )
        r.register(self.first_byte)
        replica_labels = ["pool", "replica"]
        self.ttft = Histogram(
            "pdorch_time_to_first_token_seconds",
            "Seconds from a streamed request's arrival to its first byte, by the replica that "
            "computed the prompt.",
            replica_labels,
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "pdorch_inter_token_latency_seconds",
            "Per completed stream: its mean seconds between token events, by decode replica.",
            replica_labels,
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = LoopHistogram(
            "pdorch_request_prompt_tokens",
            "Prompt tokens of each routed request.",
            ["route"],
            buckets=_TOKEN_BUCKETS,
        )
        r.register(self.prompt_tokens)
        self.generation_tokens = LoopHistogram(
            "pdorch_request_generation_tokens",
            "Output tokens of each completed request.",
            ["route"],
            buckets=_TOKEN_BUCKETS,
        )
        r.register(self.generation_tokens)
        # labelled children looked up once: `.labels()` costs as much as the observation
        self._by_route: dict[str, tuple[LoopCounterChild, LoopHistogramChild, LoopHistogramChild]]
        self._by_route = {}
        self._by_replica: dict[tuple[str, str], tuple[Histogram, Histogram]] = {}
        self._answered: dict[tuple[str, int], LoopCounterChild] = {}
        self._by_endpoint: dict[str, tuple[LoopHistogramChild, LoopHistogramChild]] = {}
        for route in _ROUTES:
            self._route(route)
        for endpoint in _ENDPOINTS:
            self._endpoint(endpoint)
            self._answered_child(endpoint, 200)
        self.coordinator = coordinator
        # the same observations per pool over the last minute (`scale status`'s p90s)
        self.recent = RecentLatency(_TTFT_BUCKETS, _ITL_BUCKETS, coordinator.clock)
        r.register(StateCollector(coordinator))

    def _route(self, route: str) -> tuple[LoopCounterChild, LoopHistogramChild, LoopHistogramChild]:
        children = self._by_route.get(route)
        if children is None:
            children = (
                self.routes.labels(route),
                self.prompt_tokens.labels(route),
                self.generation_tokens.labels(route),
            )
            self._by_route[route] = children
        return children

    def _replica(self, pool: str, replica_id: str) -> tuple[Histogram, Histogram]:
        key = (pool, replica_id)
        children = self._by_replica.get(key)
        if children is None:
            children = (self.ttft.labels(pool, replica_id), self.itl.labels(pool, replica_id))
            self._by_replica[key] = children
        return children

    def _endpoint(self, endpoint: str) -> tuple[LoopHistogramChild, LoopHistogramChild]:
        children = self._by_endpoint.get(endpoint)
        if children is None:
            children = (self.duration.labels(endpoint), self.first_byte.labels(endpoint))
            self._by_endpoint[endpoint] = children
        return children

    def _answered_child(self, endpoint: str, status: int) -> LoopCounterChild:
        key = (endpoint, status)
        child = self._answered.get(key)
        if child is None:
            child = self._answered[key] = self.requests.labels(endpoint, str(status))
        return child

    def answered(self, endpoint: str, status: int, seconds: float) -> None:
        """A client request ended: `pdorch_requests_total` and its duration."""
        self._answered_child(endpoint, status).inc()
        self._endpoint(endpoint)[0].observe(seconds)

    def decode_first_byte(self, endpoint: str, seconds: float) -> None:
        """`pdorch_first_byte_seconds`: request to the decode leg's first byte."""
        self._endpoint(endpoint)[1].observe(seconds)

    def routed(self, route: str, prompt_tokens: int) -> None:
        """A request was routed: `pdorch_routes_total` and its prompt tokens."""
        routes, prompt, _ = self._route(route)
        routes.inc()
        prompt.observe(prompt_tokens)

    def first_token(self, pool: str, replica_id: str, seconds: float) -> None:
        self._replica(pool, replica_id)[0].observe(seconds)
        self.recent.first_token(pool, seconds)

    def completed(self, route: str, output_tokens: int) -> None:
        self._route(route)[2].observe(output_tokens)

    def stream_itl(self, pool: str, replica_id: str, mean_gap_s: float) -> None:
        self._replica(pool, replica_id)[1].observe(mean_gap_s)
        self.recent.stream_itl(pool, mean_gap_s)

    def replay_ended(self, record: ReplayRecord) -> None:
        self.replay_duration.labels(record.outcome).observe(record.seconds)

    def rejected(self, reason: str) -> None:
        self._rejected.labels(reason).inc()

    def render(self) -> bytes:
        # every replica's latency series exist from its first scrape on, at 0: Prometheus's
        # rate() then counts the first request too (a series born at 1 would lose it)
        for replica in self.coordinator.fleet.replicas():
            self._replica(replica.pool, replica.replica_id)
        return generate_latest(self.registry)
