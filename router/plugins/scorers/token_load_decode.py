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

**KV-transfer term** (`transfer_weight` > 0, issue 15): a disaggregated request's TTFT includes
moving its prompt's KV into the decode replica, and the replica loads only the blocks it does
not hold (vLLM's NixlConnector asks for the remote part, `get_num_new_matched_tokens`; in a
multi-turn chat the replica that decoded the previous turn holds most of the prompt):

    transfer(r) = max(0, prompt_tokens - overlap_blocks(r) · block_size) · transfer_s_per_token
    score(r)    = load(r) + transfer_weight · transfer(r)

`transfer_weight` is in the load's units per second of transfer (a fraction of the KV pool
per second; blocks per second when a capacity is unknown). `transfer_s_per_token` = KV bytes
per token / effective link bandwidth: 131,072 B (Llama-3.1-8B bf16) / (50 GB/s · 0.8,
rdma-400g in pools/sim/profiles.py) ≈ 3.3e-6 s. Link contention (transfers into one replica
are serialized) is not in the term: the router does not see when the decode leg's pull starts.

Parameters (defaults): `expected_output_tokens` 256, `prefill_weight` 1.0, `transfer_weight`
0.0 (off), `transfer_s_per_token` 3.3e-6.

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
    transfer_weight: float = Field(default=0.0, ge=0.0)
    transfer_s_per_token: float = Field(default=3.3e-6, ge=0.0)


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
        weight = params.transfer_weight
        scores: dict[str, float] = {}
        terms: dict[str, dict[str, float]] = {}
        for r in candidates:
            used = used_blocks(r)
            pending = pending_blocks(r, request)
            projected = used + params.prefill_weight * pending + need
            score = projected / r.kv_capacity_blocks if capacity_known else projected
            row = {
                "used_blocks": float(used),
                "pending_prefill_blocks": float(pending),
                "need_blocks": float(need),
                "kv_capacity_blocks": float(r.kv_capacity_blocks),
            }
            if weight > 0.0:
                transfer = request.uncached_tokens(r.overlap_blocks) * params.transfer_s_per_token
                score += weight * transfer
                row["transfer_s"] = transfer
            scores[r.replica_id] = score
            terms[r.replica_id] = row
        return ScorerOutput(scores, terms)

    def describe(self, terms: dict[str, float]) -> str:
        text = (
            f"{terms['used_blocks']:.0f} used + {terms['pending_prefill_blocks']:.0f} pending + "
            f"{terms['need_blocks']:.0f} needed blocks of {terms['kv_capacity_blocks']:.0f}"
        )
        if "transfer_s" in terms:
            text += f", KV transfer {terms['transfer_s'] * 1e3:.1f} ms"
        return text
