"""One engine replica as the fleet sees it: where it is, which pool it serves, its health.

`ReplicaEndpoint` is the immutable address book entry (what a launcher or a static config
yields); `Replica` adds the mutable view the fleet keeps (state, failure counters, the last
`/metrics` snapshot). Only `pools.fleet.Fleet` changes a `Replica`, so every change can fire
an event the coordinator uses to update router state.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ReplicaState(StrEnum):
    """HEALTHY replicas are routable; UNHEALTHY ones are probed until they recover;
    DRAINING ones finish their requests and get no new ones (an operator or an actuator sets
    it); PENDING ones were just started by an actuator and join routing once it admits them
    (`/health` answers and the coordinator follows their KV events)."""

    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    DRAINING = "draining"
    PENDING = "pending"


@dataclass(frozen=True, slots=True)
class ReplicaEndpoint:
    """Where one engine is and what it serves.

    `kv_events_endpoint` is the engine's publisher address to *connect* to (None: the engine
    publishes no events, or connects to the coordinator's bound socket); `kv_events_topic` its
    topic frame. `metrics_url` defaults to `<url>/metrics`.
    """

    replica_id: str
    pool: str
    url: str
    model: str
    block_size: int
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    kv_events_topic: str = ""
    metrics_url: str | None = None
    num_gpu_blocks: int | None = None
    launched: bool = False
    kind: str = "static"
    # role-agnostic engine (simulated role `both`, vLLM `kv_both`): may move between the
    # prefill and decode pools without a restart (`Fleet.move_replica`)
    switchable: bool = False
    # routing constants of the replica's hardware profile (fleet file `hardware:`,
    # pools/hardware.py); None: the router's defaults
    prefill_tokens_per_s: float | None = None
    decode_s_per_kv_token: float | None = None

    @property
    def metrics_endpoint(self) -> str:
        return self.metrics_url or f"{self.url.rstrip('/')}/metrics"

    @property
    def health_endpoint(self) -> str:
        return f"{self.url.rstrip('/')}/health"


@dataclass(frozen=True, slots=True)
class ReplicaMetrics:
    """One `/metrics` scrape, reduced to what routing and load reconciliation read.

    Counters (`prefix_cache_*`) are cumulative since the engine started. `num_gpu_blocks` and
    `block_size` come from `vllm:cache_config_info` when the engine publishes it.
    """

    num_running: int
    num_waiting: int
    kv_usage: float
    prefix_cache_queries: float
    prefix_cache_hits: float
    num_gpu_blocks: int | None
    block_size: int | None
    scraped_at: float

    @property
    def prefix_hit_rate(self) -> float | None:
        """Cumulative prefix-cache hit rate (hits / queried tokens), None before any query."""
        if self.prefix_cache_queries <= 0:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries


@dataclass(slots=True)
class Replica:
    """The fleet's mutable view of one replica (change it only through `Fleet`)."""

    endpoint: ReplicaEndpoint
    healthy: bool = True
    draining: bool = False
    pending: bool = False
    state_since: float = 0.0
    added_at: float = 0.0
    consecutive_failures: int = 0
    consecutive_probe_failures: int = 0
    consecutive_probe_successes: int = 0
    last_error: str | None = None
    metrics: ReplicaMetrics | None = None

    @property
    def replica_id(self) -> str:
        return self.endpoint.replica_id

    @property
    def pool(self) -> str:
        return self.endpoint.pool

    @property
    def url(self) -> str:
        return self.endpoint.url

    @property
    def state(self) -> ReplicaState:
        """DRAINING wins over health (an operator's choice), then PENDING (not admitted yet);
        else what probes and failures say."""
        if self.draining:
            return ReplicaState.DRAINING
        if self.pending:
            return ReplicaState.PENDING
        return ReplicaState.HEALTHY if self.healthy else ReplicaState.UNHEALTHY

    @property
    def routable(self) -> bool:
        return self.state is ReplicaState.HEALTHY

    @property
    def kv_capacity_blocks(self) -> int:
        """KV blocks in the engine's pool: the last scrape's `vllm:cache_config_info`, else
        what the launcher learnt at start-up, else 0 (unknown)."""
        if self.metrics is not None and self.metrics.num_gpu_blocks:
            return self.metrics.num_gpu_blocks
        return self.endpoint.num_gpu_blocks or 0
