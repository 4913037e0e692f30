"""What a planner reads each control tick: one `Observation` of the fleet over a window.

The same structure is filled by the fleet simulator (virtual time) and, live, by the metrics
sources (the coordinator's own request metrics, scraped engine `/metrics`, or Prometheus). A
planner never reads anything else, so one planner implementation runs in both places.

Units are in the field names: `_s` seconds, `_rps` requests per second, `_tokens` tokens.
Percentiles of TTFT and ITL are over the requests whose first token (TTFT) or whose tokens
(ITL) fell inside the window; `None` when the window saw none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Pool(StrEnum):
    """The pools a planner sizes. Prefill is sized against TTFT, decode against ITL."""

    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """Replica counts of one pool as the actuator reports them.

    `ready` replicas serve traffic; `pending` were asked for and are starting (they count as
    capacity that is coming, so a planner must not ask for them again); `draining` are leaving
    (no new requests; they still finish their in-flight work) and count as no capacity.
    """

    ready: int = 0
    pending: int = 0
    draining: int = 0

    @property
    def provisioned(self) -> int:
        """Replicas that are, or will soon be, serving: ready + pending."""
        return self.ready + self.pending


@dataclass(frozen=True, slots=True)
class ReplicaSignals:
    """One ready replica's load at the end of the window (from the engine's own metrics)."""

    replica_id: str
    pool: Pool
    num_running: int = 0
    num_waiting: int = 0
    queued_prefill_tokens: int = 0  # uncached prompt tokens admitted and not yet prefilled
    kv_usage: float = 0.0  # fraction of the KV pool in use, 0..1
    kv_capacity_tokens: int = 0
    decode_kv_tokens: int = 0  # KV tokens of the sequences it decodes
    mean_step_s: float | None = None  # mean engine step time over the window


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Observed percentiles (seconds) and the count they were computed from."""

    count: int = 0
    p50_s: float | None = None
    p90_s: float | None = None
    p99_s: float | None = None
    mean_s: float | None = None

    def percentile(self, q: float) -> float | None:
        """The stored percentile nearest to `q` (50, 90 or 99)."""
        if q >= 99:
            return self.p99_s
        if q >= 90:
            return self.p90_s
        return self.p50_s


@dataclass(frozen=True, slots=True)
class Observation:
    """The fleet over the last `window_s` seconds, at time `now` (see module docstring)."""

    now: float
    window_s: float
    pools: dict[Pool, PoolStatus]
    # load that arrived in the window
    num_requests: int = 0
    arrival_rps: float = 0.0
    mean_isl_tokens: float = 0.0  # prompt tokens per request
    mean_osl_tokens: float = 0.0  # output tokens per request (finished ones; else max_tokens)
    prefix_hit_rate: float = 0.0  # fraction of prompt tokens served from cache, 0..1
    # what the clients saw
    ttft: LatencySummary = field(default_factory=LatencySummary)
    itl: LatencySummary = field(default_factory=LatencySummary)  # per-request mean ITL
    slo_attainment: float | None = None  # fraction of finished requests within both SLOs
    replicas: tuple[ReplicaSignals, ...] = ()
    # the prefill leg alone: each disaggregated request's arrival to its prefill's end (queue
    # wait + the prefill step(s); no KV transfer, no decode step) over the legs that ended in
    # the window, and their mean uncached prompt tokens; empty when the source cannot say
    # (the online fit then reads `ttft`: `autoscale.perf_model_online`, "prefill signal")
    prefill_leg: LatencySummary = field(default_factory=LatencySummary)
    prefill_leg_uncached_tokens: float = 0.0

    def pool(self, pool: Pool) -> PoolStatus:
        return self.pools.get(pool, PoolStatus())

    def replicas_of(self, pool: Pool) -> list[ReplicaSignals]:
        return [r for r in self.replicas if r.pool is pool]

    def decode_waiting(self) -> int:
        """Sequences waiting for a decode slot at the window's end (Σ `num_waiting` of the
        decode replicas: the simulator's engine cores, `vllm:num_requests_waiting` live). The
        decode replica emits the first token, so a sequence waiting here waits for its TTFT:
        a TTFT the prefill pool did not cause (`autoscale.planner_terms`)."""
        return sum(r.num_waiting for r in self.replicas if r.pool is Pool.DECODE)
