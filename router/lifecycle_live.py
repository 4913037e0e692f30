"""One admitted request's state in `RequestLifecycle` (router/lifecycle.py), and the recorder
that writes one `LifecycleEvent` per event (the agreement test replays them).

Split from `router/lifecycle.py` (proxy-7, code health: below ~500 lines); unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router.lifecycle_plan import DecodeLeg, EventKind, KvLookup, LifecycleEvent, RequestPlan
from router.lifecycle_pools import ReplicaPools
from router.replica_state import RoutingRequest
from router.token_load import TokenLoad
from router.vocabulary import PoolName, RouteKind


def blocks(tokens: int, block_size: int) -> int:
    """KV blocks of `tokens` tokens (the last, partial block counts)."""
    return -(-tokens // block_size) if block_size > 0 else 0


@dataclass(slots=True)
class LiveRequest:
    """One admitted request's state."""

    request: RoutingRequest
    lookup: KvLookup
    kind: RouteKind  # now (PD may become FALLBACK)
    serving: PoolName  # where retries look: DECODE or COLOCATED
    prefill: str | None  # the PD prefill replica (kept after its leg, for `prefilled_by`)
    decode: str
    with_kv: bool
    prefilling: bool = False  # the PD prefill leg runs
    generated: int = -1  # -1: no token event yet (the prompt may still be prefilling)
    tried: list[str] = field(default_factory=list)


class EventRecorder:
    """Appends each event, with its inputs and every member's token load after it."""

    __slots__ = ("events", "pools", "token_load")

    def __init__(
        self, events: list[LifecycleEvent], pools: ReplicaPools, token_load: TokenLoad
    ) -> None:
        self.events = events
        self.pools = pools
        self.token_load = token_load

    def record(
        self,
        kind: EventKind,
        request_id: str,
        now: float,
        *,
        request: RoutingRequest | None = None,
        lookup: KvLookup | None = None,
        ok: bool | None = None,
        reached: bool | None = None,
        generated: int | None = None,
        plan: RequestPlan | None = None,
        leg: DecodeLeg | None = None,
    ) -> None:
        tl = self.token_load
        static = self.pools.statics() if request is not None or lookup is not None else {}
        self.events.append(
            LifecycleEvent(
                kind,
                request_id,
                now,
                request,
                lookup,
                static,
                ok,
                reached,
                generated,
                plan,
                leg,
                {rid: tl.tracked_load(rid) for rid in self.pools.ids()},
            )
        )
