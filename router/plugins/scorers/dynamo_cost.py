"""`dynamo_cost`: NVIDIA Dynamo KV router's worker cost (`DefaultWorkerSelector`).

Dynamo's `ActiveSequences` book every routed request on its worker until it completes, as
active prefill tokens (its uncached prompt, until prefilled) and active blocks; a worker's
potential load is its active load plus this request's:

    prefill_blocks(r) = (prefill_tokens_queued(r) + uncached(r)) / block_size
    uncached(r)       = max(0, prompt_tokens - overlap_blocks(r) · block_size)
    decode_blocks(r)  = decode_blocks_active(r) + request_blocks
    cost(r)           = overlap_score_weight · prefill_blocks(r) + decode_blocks(r)

Lower is better. `prefill_tokens_queued` is pdorch's token load (Dynamo's active prefill
tokens): without it a pure prefill replica, which never holds decode blocks, looks idle however
long its queue. Simplifications: Dynamo de-duplicates blocks shared with active sequences in
the request's potential blocks; pdorch adds `request_blocks` to every replica, which shifts all
costs equally. Dynamo's active blocks also hold the prompt blocks of requests still
prefilling; pdorch counts those only through their uncached part in `prefill_blocks`. The
choice (lowest cost, ties to the smaller cached tree; or a softmax draw) is the picker's
(`dynamo` profile: `softmax` with `tie_break: [cached_blocks]`).

Parameters (defaults, Dynamo's): `overlap_score_weight` 1.0 (higher favours TTFT, lower ITL).

Example::

    scorers: [{name: dynamo_cost, params: {overlap_score_weight: 1.0}}]
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from router.plugins.base import Scorer, ScorerOutput
from router.plugins.registry import register
from router.replica_state import ReplicaSnapshot, RoutingRequest


class DynamoCostParams(BaseModel):
    """Parameters of the `dynamo_cost` scorer."""

    model_config = ConfigDict(extra="forbid")
    overlap_score_weight: float = Field(default=1.0, ge=0.0)


@register
class DynamoCostScorer(Scorer[DynamoCostParams]):
    """`w · prefill_blocks + decode_blocks`; lower wins."""

    name = "dynamo_cost"
    params_model = DynamoCostParams
    higher_is_better = False

    def score(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> ScorerOutput:
        bs = max(1, request.block_size)
        request_blocks = request.prompt_blocks
        weight = self.params.overlap_score_weight
        costs: dict[str, float] = {}
        terms: dict[str, dict[str, float]] = {}
        for r in candidates:
            queued = r.prefill_tokens_queued
            prefill_blocks = (queued + request.uncached_tokens(r.overlap_blocks)) / bs
            decode_blocks = float(r.decode_blocks + request_blocks)
            costs[r.replica_id] = weight * prefill_blocks + decode_blocks
            terms[r.replica_id] = {
                "prefill_blocks": prefill_blocks,
                "queued_prefill_tokens": float(queued),
                "decode_blocks": decode_blocks,
                "overlap_blocks": float(r.overlap_blocks),
            }
        return ScorerOutput(costs, terms)

    def describe(self, terms: dict[str, float]) -> str:
        return (
            f"{self.params.overlap_score_weight:g}*{terms['prefill_blocks']:.2f} prefill + "
            f"{terms['decode_blocks']:.0f} decode blocks"
        )
