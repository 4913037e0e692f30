"""`prefix`: how much of the request's prompt the replica already caches (KV index overlap).

    fraction (default, llm-d's prefix-cache scorer): overlap_blocks(r) / request_blocks
        request_blocks = len(block_keys), or prompt_tokens // block_size without keys;
        0 when the request has no full block; capped at 1
    blocks:   overlap_blocks(r)                    (the raw count `kv_overlap` maximises)

Higher is better. Parameters (defaults): `unit` (`fraction` | `blocks`, `fraction`).

Example::

    scorers: [{name: prefix, weight: 3}]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from router.plugins.base import Scorer, ScorerOutput
from router.plugins.registry import register
from router.replica_state import ReplicaSnapshot, RoutingRequest


class PrefixParams(BaseModel):
    """Parameters of the `prefix` scorer."""

    model_config = ConfigDict(extra="forbid")
    unit: Literal["fraction", "blocks"] = "fraction"


@register
class PrefixScorer(Scorer[PrefixParams]):
    """Cached leading blocks of the prompt; more wins."""

    name = "prefix"
    params_model = PrefixParams

    def score(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> ScorerOutput:
        if self.params.unit == "blocks":
            return ScorerOutput({r.replica_id: float(r.overlap_blocks) for r in candidates})
        total = len(request.block_keys) or request.prompt_tokens // max(1, request.block_size)
        if total <= 0:
            return ScorerOutput(dict.fromkeys((r.replica_id for r in candidates), 0.0))
        return ScorerOutput({r.replica_id: min(1.0, r.overlap_blocks / total) for r in candidates})
