"""`kv_headroom`: drop decode replicas without KV room for the request to grow into.

With `need`, `used(r)` and `pending(r)` as defined in `router/plugins/scorers/token_load_decode.py`
(blocks the request will occupy, blocks in use, blocks of prefill queued there):

    headroom(r) = floor(capacity(r) · (1 - kv_headroom_margin)) - used(r) - pending(r)
    keep r      iff headroom(r) ≥ need

Rejected replicas read `"kv headroom H blocks < need N"`. Soft on purpose: when no candidate
fits, all are kept (the best-scored one still wins, the reason says so, and the coordinator
may queue); when any candidate's capacity is unknown (0), nobody is dropped.

Parameters (defaults): `expected_output_tokens` 256, `kv_headroom_margin` 0.0 (fraction of
the pool kept free, in [0, 1)).

Example::

    filters: [{name: health}, {name: kv_headroom, params: {kv_headroom_margin: 0.05}}]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from router.plugins.base import Filter, FilterResult
from router.plugins.registry import register
from router.plugins.scorers.token_load_decode import decode_need_blocks, pending_blocks, used_blocks
from router.replica_state import ReplicaSnapshot, RoutingRequest


class KvHeadroomParams(BaseModel):
    """Parameters of `kv_headroom`."""

    model_config = ConfigDict(extra="forbid")
    expected_output_tokens: int = Field(default=256, ge=0)
    kv_headroom_margin: float = Field(default=0.0, ge=0.0, lt=1.0)


@register
class KvHeadroomFilter(Filter[KvHeadroomParams]):
    """Replicas with KV headroom for the request (all, if none has)."""

    name = "kv_headroom"
    params_model = KvHeadroomParams

    def filter(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> FilterResult:
        if not all(r.kv_capacity_blocks > 0 for r in candidates):
            return FilterResult(list(candidates))
        params = self.params
        need = decode_need_blocks(request, params.expected_output_tokens)
        kept: list[ReplicaSnapshot] = []
        rejected: dict[str, str] = {}
        for r in candidates:
            usable = math.floor(r.kv_capacity_blocks * (1.0 - params.kv_headroom_margin))
            headroom = usable - used_blocks(r) - pending_blocks(r, request)
            if headroom < need:
                rejected[r.replica_id] = f"kv headroom {headroom} blocks < need {need}"
            else:
                kept.append(r)
        if not kept:
            return FilterResult(
                list(candidates),
                note=f"no replica has KV headroom for {need} blocks: chosen anyway",
            )
        return FilterResult(kept, rejected)
