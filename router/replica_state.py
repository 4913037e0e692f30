"""What a routing policy sees: one request and one snapshot per candidate replica.

Policies are pure functions of these two inputs (plus `now`), so the same policy code runs in the
coordinator (real time) and in the fleet simulator (virtual time), and every decision can be
replayed from its inputs. Both types are slotted dataclasses rather than pydantic models: a
decision over 256 replicas builds 256 snapshots, and that sits on the request path (see
`benchmarks/router_bench.py`). The explain structure (`router/explain.py`) is the pydantic view.

Units: tokens and KV blocks of `RoutingRequest.block_size` tokens; `kv_usage` is a fraction in
[0, 1] as vLLM reports `vllm:kv_cache_usage_perc`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class RoutingRequest:
    """The per-request input of a routing decision.

    `block_keys` are the request's full-block keys (pdorch's own chained xxh3-64 keys, see
    `router/block_keys.py`); `prompt_text` is only needed by text-based policies
    (`cache_aware`); `session_key` by `consistent_hash`; `max_tokens` lets the decode policy size
    the KV the request will grow into. `eligible`: the only replicas that may serve it (a LoRA
    request: those with its adapter loaded); None = any. The others are candidates marked
    unhealthy, so every policy skips them and explain still shows them.
    """

    request_id: str
    prompt_tokens: int
    block_size: int = 16
    block_keys: Sequence[int] = ()
    session_key: str | None = None
    prompt_text: str | None = None
    max_tokens: int | None = None
    eligible: frozenset[str] | None = None

    @property
    def prompt_blocks(self) -> int:
        """Blocks the prompt occupies once prefilled (the last, partial block counts)."""
        return -(-self.prompt_tokens // self.block_size) if self.block_size > 0 else 0

    def uncached_tokens(self, overlap_blocks: int) -> int:
        """Prompt tokens a replica holding `overlap_blocks` leading blocks still has to prefill."""
        return max(0, self.prompt_tokens - overlap_blocks * self.block_size)


@dataclass(slots=True)
class ReplicaSnapshot:
    """One candidate replica as a policy sees it at decision time.

    - `overlap_blocks`: leading blocks of *this request* the replica holds (from the KV index).
    - `prefill_tokens_queued`: uncached prefill tokens admitted to the replica and not yet
      prefilled (token load, `router/token_load.py`).
    - `decode_blocks`: KV blocks of context of the sequences the replica is decoding.
    - `kv_usage`, `num_running`, `num_waiting`: the last scraped engine metrics.
    - `kv_capacity_blocks`: the replica's KV pool size in blocks (0 = unknown).
    - `requests_in_flight`: requests this router has sent and not seen finish (SGLang's and
      least-request's notion of load).
    - `prefill_tokens_per_s`: the replica's prefill throughput, if profiled (None = use the
      policy's default).
    - `cached_blocks`: blocks the index holds for the replica (Dynamo's tie-break: smaller tree).
    - `role`: the replica's pool (`prefill` | `decode` | `colocated`) when the caller mixes
      pools in one candidate list (the `role` filter reads it); None = not given.
    - `decoding`: (remaining output tokens, decode blocks) of each sequence the replica decodes
      or will decode; remaining = `max_tokens` minus tokens generated so far, -1 when the request
      gave no `max_tokens` (token load, `TokenLoad._decoding`). The straggler-aware decode term
      of `token_load` reads it.
    - `decode_s_per_kv_token`: the replica's own seconds to read one KV token in a decode step
      (KV bytes per token / HBM bandwidth of its hardware profile; None = the policy's
      default). `token_load@per_replica_decode_cost=true` and `latency_predictor` read it.
    - `latency`: the lifecycle's learnt latency fit of the replica
      (`router/latency_predictor.py`; None = no fit kept). `latency_predictor` reads it.

    Read-only by convention; not `frozen` because frozen dataclasses construct several times
    slower and one decision builds a snapshot per candidate replica.
    """

    replica_id: str
    healthy: bool = True
    overlap_blocks: int = 0
    prefill_tokens_queued: int = 0
    decode_blocks: int = 0
    kv_usage: float = 0.0
    num_running: int = 0
    num_waiting: int = 0
    kv_capacity_blocks: int = 0
    requests_in_flight: int = 0
    prefill_tokens_per_s: float | None = None
    cached_blocks: int = 0
    role: str | None = None
    decoding: tuple[tuple[int, int], ...] = ()
    decode_s_per_kv_token: float | None = None
    latency: LatencyEstimate | None = None


@dataclass(frozen=True, slots=True)
class LatencyEstimate:
    """A replica's learnt latency calibration (`router/latency_predictor.py` fits it).

    Both fits correct the `token_load` model's own estimate `x` of the same quantity:
    `observed ≈ intercept + ratio · x`. Prefill: `x` = the prefill seconds `token_load`
    predicts for the work queued ahead plus the request's own uncached tokens; decode: `x` = the
    per-step slow-down it predicts (`n / tps + c · K`), observed as a request's mean time per
    output token. A fresh replica is `(0, 1, 0, 1)`: exactly the model.
    """

    prefill_intercept_s: float = 0.0
    prefill_ratio: float = 1.0
    decode_intercept_s: float = 0.0
    decode_ratio: float = 1.0
    prefill_observations: int = 0
    decode_observations: int = 0


@dataclass(slots=True)
class ReplicaLoad:
    """The load half of a snapshot, as `TokenLoad.load(replica_id, now)` reports it."""

    prefill_tokens_queued: int = 0
    decode_blocks: int = 0
    requests_in_flight: int = 0
    kv_usage: float = 0.0
    num_running: int = 0
    num_waiting: int = 0
    kv_capacity_blocks: int = 0
    # (remaining output tokens or -1 if unknown, decode blocks) per decoding sequence
    decoding: tuple[tuple[int, int], ...] = ()


class LoadSource(Protocol):
    """Anything that reports a replica's load (the `TokenLoad` tracker does)."""

    def load(self, replica_id: str, now: float) -> ReplicaLoad: ...


@dataclass(frozen=True, slots=True)
class ReplicaStatic:
    """Per-replica facts that change rarely (health, profiled throughput and KV-read cost from
    the replica's hardware profile) and, when a policy learns one, the lifecycle's latency fit
    (a new object at most once per observed prefill or decode)."""

    healthy: bool = True
    prefill_tokens_per_s: float | None = None
    decode_s_per_kv_token: float | None = None
    latency: LatencyEstimate | None = None


_DEFAULT_STATIC = ReplicaStatic()


def build_snapshots(
    replica_ids: Iterable[str],
    overlap: Mapping[str, int],
    loads: LoadSource,
    now: float,
    static: Mapping[str, ReplicaStatic] | None = None,
    cached_blocks: Mapping[str, int] | None = None,
) -> list[ReplicaSnapshot]:
    """Join the index's overlap map (`KvIndex.match`), token load and health into snapshots.

    Replicas missing from `overlap` hold none of the request's blocks.
    """
    static = static or {}
    cached_blocks = cached_blocks or {}
    snapshots: list[ReplicaSnapshot] = []
    append = snapshots.append
    get_load = loads.load
    get_static = static.get
    get_overlap = overlap.get
    get_cached = cached_blocks.get
    for rid in replica_ids:
        load = get_load(rid, now)
        info = get_static(rid, _DEFAULT_STATIC)
        # Positional, in field order: this loop runs once per candidate on every decision.
        append(
            ReplicaSnapshot(
                rid,
                info.healthy,
                get_overlap(rid, 0),
                load.prefill_tokens_queued,
                load.decode_blocks,
                load.kv_usage,
                load.num_running,
                load.num_waiting,
                load.kv_capacity_blocks,
                load.requests_in_flight,
                info.prefill_tokens_per_s,
                get_cached(rid, 0),
                None,
                load.decoding,
                info.decode_s_per_kv_token,
                info.latency,
            )
        )
    return snapshots


@dataclass(slots=True)
class PolicyDecision:
    """What every `pick` returns: the choice, why, and every candidate's score.

    `scores` holds one number per candidate replica (unhealthy/rejected ones included, with
    `rejected[replica_id]` saying why). `higher_is_better` says how to read them (llm-d scores
    are maximised, Dynamo costs and token-load times minimised). `details` holds the terms of
    each score (e.g. `{"prefix": 0.92, "queue": 0.93}`) for the explain API.

    `why` is the reason as given: a string, or a function that builds it. Read it as `reason`
    (built on first read, then kept). Why lazy: formatting a reason costs more than some
    decisions themselves, and the fleet simulator and the proxy's hot path never read it; only
    `/admin/explain` and reports do (issue 15's proxy profile, issue 11's simulator profile).
    `terms` likewise: the details as given, or a function that builds them; read them as
    `details` (a row of named floats per candidate is most of a 1,024-replica decision's cost
    when built eagerly, and only explain reads it; issue 15's router profile).
    """

    policy: str
    chosen: str | None
    why: str | Callable[[], str]
    scores: dict[str, float] = field(default_factory=dict)
    higher_is_better: bool = False
    terms: dict[str, dict[str, float]] | Callable[[], dict[str, dict[str, float]]] = field(
        default_factory=dict
    )
    rejected: dict[str, str] = field(default_factory=dict)

    @property
    def details(self) -> dict[str, dict[str, float]]:
        """Each candidate's score terms: built from `terms` on first read, then kept."""
        terms = self.terms
        if callable(terms):
            terms = self.terms = terms()
        return terms

    @property
    def reason(self) -> str:
        """Why this replica (or why none): built from `why` on first read."""
        why = self.why
        if isinstance(why, str):
            return why
        text = self.why = why()
        return text
