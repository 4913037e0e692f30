"""`session_hash`: sticky sessions on a consistent-hash ring with virtual nodes.

Each candidate `r` owns `virtual_nodes` points `h(f"{r}#{i}")` on a 64-bit ring (`h` =
xxh3-64; the ring is built over the candidates' ids, sorted); session key `k` belongs to the
owner of the first point at or after `h(k)` (wrapping):

    score(r) = 1.0 if r owns the request's session key else 0.0
             = 0.0 for everyone when the request has no session key

Higher is better. Removing (or failing) a replica moves only the sessions it owned. The
coordinator fills `RoutingRequest.session_key` from its configured header (e.g.
`x-session-id`). Requests without a key are placed by the next scorer (the `lexicographic`
picker's `fallback`). Rings are memoised per membership (a cache, not decision state).

Parameters (defaults): `virtual_nodes` 160 (SGLang router's).

Example::

    scorers: [{name: session_hash, params: {virtual_nodes: 160}}, {name: least_request}]
    picker: {name: lexicographic}
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import xxhash
from pydantic import BaseModel, ConfigDict, Field

from router.plugins.base import Scorer, ScorerOutput
from router.plugins.registry import register
from router.replica_state import ReplicaSnapshot, RoutingRequest


class SessionHashParams(BaseModel):
    """Parameters of the `session_hash` scorer."""

    model_config = ConfigDict(extra="forbid")
    virtual_nodes: int = Field(default=160, ge=1, le=10_000)


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


@register
class SessionHashScorer(Scorer[SessionHashParams]):
    """1 for the session's ring owner."""

    name = "session_hash"
    params_model = SessionHashParams

    def __init__(self, params: SessionHashParams) -> None:
        super().__init__(params)
        self._rings: dict[tuple[str, ...], _Ring] = {}

    def owner(self, session_key: str, candidates: Sequence[ReplicaSnapshot]) -> str:
        """The candidate owning `session_key` on the ring of `candidates`."""
        ids = tuple(sorted(r.replica_id for r in candidates))
        ring = self._rings.get(ids)
        if ring is None:
            if len(self._rings) > 64:  # membership churn: keep the memo small
                self._rings.clear()
            ring = _Ring(ids, self.params.virtual_nodes)
            self._rings[ids] = ring
        return ring.owner(session_key)

    def score(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> ScorerOutput:
        if not request.session_key or not candidates:
            return ScorerOutput(dict.fromkeys((r.replica_id for r in candidates), 0.0))
        chosen = self.owner(request.session_key, candidates)
        return ScorerOutput({r.replica_id: float(r.replica_id == chosen) for r in candidates})

    def on_replica_removed(self, replica_id: str, now: float) -> None:
        self._rings.clear()
