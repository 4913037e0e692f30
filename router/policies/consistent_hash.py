"""`consistent_hash`: sticky sessions on a hash ring with virtual nodes.

Formula: each healthy replica `r` owns `virtual_nodes` points `h(f"{r}#{i}")` on a 64-bit ring
(`h` = xxh3-64); a request with session key `k` goes to the owner of the first point at or
after `h(k)` (wrapping). Removing a replica moves only the keys it owned (to the next point's
owner); every other key stays where it was. Requests without a session key go to the
`fallback` policy.

Parameters (default): `virtual_nodes` (160, as SGLang's router), `fallback`
(`least_request`; or `round_robin`, cycling over healthy replicas).
The session key comes from the request header the coordinator is configured with (e.g.
`x-session-id`), carried as `RoutingRequest.session_key`.

Example YAML::

    decode: {name: consistent_hash, params: {virtual_nodes: 160, fallback: least_request}}
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Literal

import xxhash
from pydantic import BaseModel, ConfigDict, Field

from router.policies.base import Policy, healthy_only
from router.policies.registry import register
from router.replica_state import PolicyDecision, ReplicaSnapshot, RoutingRequest


class ConsistentHashParams(BaseModel):
    """Parameters of `consistent_hash`."""

    model_config = ConfigDict(extra="forbid")
    virtual_nodes: int = Field(default=160, ge=1, le=10_000)
    fallback: Literal["least_request", "round_robin"] = "least_request"


def _hash(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode())


class _Ring:
    __slots__ = ("owners", "points")

    def __init__(self, replica_ids: Sequence[str], virtual_nodes: int) -> None:
        pairs = sorted(
            (_hash(f"{rid}#{i}"), rid) for rid in replica_ids for i in range(virtual_nodes)
        )
        self.points = [p for p, _ in pairs]
        self.owners = [rid for _, rid in pairs]

    def owner(self, key: str) -> str:
        idx = bisect.bisect_left(self.points, _hash(key))
        return self.owners[idx % len(self.owners)]


@register("session_hash")
class ConsistentHashPolicy(Policy[ConsistentHashParams]):
    """Session affinity on a virtual-node hash ring."""

    name = "consistent_hash"
    params_model = ConsistentHashParams

    def _setup(self) -> None:
        self._rings: dict[tuple[str, ...], _Ring] = {}
        self._counter = 0

    def _ring(self, replica_ids: tuple[str, ...]) -> _Ring:
        ring = self._rings.get(replica_ids)
        if ring is None:
            params = self.params
            if len(self._rings) > 64:  # membership churn: keep the memo small
                self._rings.clear()
            ring = _Ring(replica_ids, params.virtual_nodes)
            self._rings[replica_ids] = ring
        return ring

    def pick(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> PolicyDecision:
        params = self.params
        healthy, rejected = healthy_only(replicas)
        if not healthy:
            return self._no_healthy(replicas)
        if request.session_key:
            ids = tuple(sorted(r.replica_id for r in healthy))
            chosen = self._ring(ids).owner(request.session_key)
            reason = f"session {request.session_key!r} hashes to {chosen}"
        elif params.fallback == "round_robin":
            chosen = healthy[self._counter % len(healthy)].replica_id
            reason = "no session key: round_robin fallback"
        else:
            chosen = min(healthy, key=lambda r: (r.requests_in_flight, r.replica_id)).replica_id
            reason = "no session key: least_request fallback"
        return PolicyDecision(
            policy=self.name,
            chosen=chosen,
            reason=reason,
            scores={r.replica_id: float(r.replica_id == chosen) for r in healthy},
            higher_is_better=True,
            rejected=rejected,
        )

    def on_request_routed(self, request: RoutingRequest, replica_id: str, now: float) -> None:
        if not request.session_key:
            self._counter += 1

    def on_replica_removed(self, replica_id: str, now: float) -> None:
        self._rings.clear()
