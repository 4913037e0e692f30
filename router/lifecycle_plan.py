"""What `RequestLifecycle` (router/lifecycle.py) takes and returns: lookups, leg plans, events.

Plain slotted dataclasses: a caller (the coordinator's HTTP flow, the fleet simulator) reads
a plan and does the I/O it names; the lifecycle never does any. The recorded events
(`LifecycleEvent`) carry every input the lifecycle saw, so a trace can be replayed through a
fresh lifecycle and must give the same plans and the same token-load states
(tests/coordinator/test_lifecycle_agreement.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from router.pd_router import PdRoute
from router.replica_state import ReplicaLoad, ReplicaSnapshot, ReplicaStatic, RoutingRequest
from router.vocabulary import RouteKind


@dataclass(frozen=True, slots=True)
class KvLookup:
    """One request's KV index answer: leading cached blocks per replica (`overlap`, absent =
    0) and the blocks each replica's index entry holds (`cached_blocks`, Dynamo's tie-break)."""

    overlap: Mapping[str, int]
    cached_blocks: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class PrefillLeg:
    """Send the prefill-only leg (`max_tokens=1`, `do_remote_decode`) to `replica`, which has
    `uncached_tokens` of the prompt to compute."""

    replica: str
    uncached_tokens: int


@dataclass(frozen=True, slots=True)
class DecodeLeg:
    """Send the decode leg to `replica`.

    `with_kv`: the leg carries the prefill's `kv_transfer_params` (the engine pulls the KV and
    computes no prompt token but the last); otherwise it prefills `uncached_tokens` itself.
    `kind` is the request's route as it stands now (the `x-pdorch-route` header) and
    `prefilled_by` the replica that prefills (`x-pdorch-prefill`).
    """

    replica: str
    with_kv: bool
    uncached_tokens: int
    kind: RouteKind
    prefilled_by: str


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """What to do with an admitted request: the prefill leg first (PD routes only), then the
    decode leg. On PD routes `decode` is the leg to send once the prefill returns *ok*;
    `RequestLifecycle.prefill_done` confirms it or returns the fallback leg."""

    request_id: str
    kind: RouteKind
    prefill: PrefillLeg | None
    decode: DecodeLeg


@dataclass(slots=True)
class RoutedRequest:
    """A routing decision with its inputs: the lookup and the snapshots (explain API)."""

    request: RoutingRequest
    route: PdRoute
    lookup: KvLookup
    prefill: Sequence[ReplicaSnapshot]  # `ReplicaColumns` from the lifecycle
    decode: Sequence[ReplicaSnapshot]
    colocated: Sequence[ReplicaSnapshot]

    @property
    def overlap(self) -> Mapping[str, int]:
        return self.lookup.overlap


class EventKind(StrEnum):
    """The request events a lifecycle takes (each with `now`)."""

    ADMITTED = "admitted"
    PREFILL_DONE = "prefill_done"
    KV_LANDED = "kv_landed"
    TOKENS = "tokens"
    DECODE_FAILED = "decode_failed"
    DECODE_RETRIED = "decode_retried"
    MIGRATED = "migrated"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(slots=True)
class LifecycleEvent:
    """One event as the lifecycle saw it, with its inputs and what it decided.

    Inputs: `request`, `lookup` and `static` (per-replica health/throughput at decision time)
    for `admitted` and `decode_retried` (`migrated`: `lookup`); `ok` for `prefill_done`;
    `reached` for `decode_failed`; `generated` for `tokens` and `migrated`. Outputs: `plan`
    (admitted), `leg` (the decode leg of prefill_done / decode_retried / migrated; None when no
    replica is left). `loads`: every known
    replica's `TokenLoad.tracked_load` after the event.
    """

    kind: EventKind
    request_id: str
    now: float
    request: RoutingRequest | None = None
    lookup: KvLookup | None = None
    static: dict[str, ReplicaStatic] = field(default_factory=dict)
    ok: bool | None = None
    reached: bool | None = None
    generated: int | None = None
    plan: RequestPlan | None = None
    leg: DecodeLeg | None = None
    loads: dict[str, ReplicaLoad] = field(default_factory=dict)
