"""`token_load_decode`: projected KV load of a decode replica once this request is on it.

    need        = ceil((prompt_tokens + out) / block_size)
                  out = min(max_tokens, expected_output_tokens), or expected_output_tokens
    used(r)     = max(decode_blocks(r), ceil(kv_usage(r) · capacity(r)))
    pending(r)  = ceil(prefill_tokens_queued(r) / block_size)
    load(r)     = (used(r) + prefill_weight · pending(r) + need) / capacity(r)

Lower is better. When any candidate's capacity is unknown (0), `load` is compared in blocks
(no division). The `kv_headroom` filter (same `need`, `used`, `pending`) drops replicas that
cannot hold the request first. Decode is bandwidth-bound: the KV a replica reads per step is
what slows every sequence on it, and queued prefill will become decode KV there soon.

Parameters (defaults): `expected_output_tokens` 256, `prefill_weight` 1.0.

Example::

    scorers: [{name: token_load_decode, params: {expected_output_tokens: 512}}]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from router.plugins.base import Scorer, ScorerOutput
from router.plugins.registry import register
from router.replica_state import ReplicaSnapshot, RoutingRequest


class TokenLoadDecodeParams(BaseModel):
    """Parameters of the `token_load_decode` scorer."""

    model_config = ConfigDict(extra="forbid")
    expected_output_tokens: int = Field(default=256, ge=0)
    prefill_weight: float = Field(default=1.0, ge=0.0)


def decode_need_blocks(request: RoutingRequest, expected_output_tokens: int) -> int:
    """Blocks the request is expected to occupy on its decode replica (`need`)."""
    out = expected_output_tokens
    if request.max_tokens is not None:
        out = min(request.max_tokens, expected_output_tokens)
    return math.ceil((request.prompt_tokens + out) / max(1, request.block_size))


def used_blocks(r: ReplicaSnapshot) -> int:
    """`used(r)`: tracked decode blocks, or what the engine reports in use if more."""
    return max(r.decode_blocks, math.ceil(r.kv_usage * r.kv_capacity_blocks - 1e-9))


def pending_blocks(r: ReplicaSnapshot, request: RoutingRequest) -> int:
    """`pending(r)`: blocks of the prefill queued on `r`."""
    return math.ceil(r.prefill_tokens_queued / max(1, request.block_size))


@register
class TokenLoadDecodeScorer(Scorer[TokenLoadDecodeParams]):
    """Projected KV load after admission; lower wins."""

    name = "token_load_decode"
    params_model = TokenLoadDecodeParams
    higher_is_better = False

    def score(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> ScorerOutput:
        params = self.params
        need = decode_need_blocks(request, params.expected_output_tokens)
        capacity_known = all(r.kv_capacity_blocks > 0 for r in candidates)
        scores: dict[str, float] = {}
        terms: dict[str, dict[str, float]] = {}
        for r in candidates:
            used = used_blocks(r)
            pending = pending_blocks(r, request)
            projected = used + params.prefill_weight * pending + need
            scores[r.replica_id] = projected / r.kv_capacity_blocks if capacity_known else projected
            terms[r.replica_id] = {
                "used_blocks": float(used),
                "pending_prefill_blocks": float(pending),
                "need_blocks": float(need),
                "kv_capacity_blocks": float(r.kv_capacity_blocks),
            }
        return ScorerOutput(scores, terms)

    def describe(self, terms: dict[str, float]) -> str:
        return (
            f"{terms['used_blocks']:.0f} used + {terms['pending_prefill_blocks']:.0f} pending + "
            f"{terms['need_blocks']:.0f} needed blocks of {terms['kv_capacity_blocks']:.0f}"
        )
