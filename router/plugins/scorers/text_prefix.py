"""`text_prefix`: how much of the prompt *text* this router already sent to the replica
(SGLang / vllm-router `cache_aware`'s approximate radix tree, `router/text_prefix_tree.py`).

    score(r)      = match_rate(r) = matched_chars(r) / len(prompt_text)   (0 without text)
    tree_chars(r) = characters of the tree attributed to r                (a term)

Higher is better. State, changed only in `on_request_routed`: the prompt text is inserted under
the replica it was sent to; every `eviction_interval_s` (checked on routing, with `now`, not in
a sleeping thread) each replica's share is trimmed to `max_tree_size` characters by its least
recently used leaves. Text, not tokens: no tokenizer on the routing path.

Parameters (defaults, SGLang router's): `eviction_interval_s` 120, `max_tree_size` 67,108,864.

Example::

    scorers: [{name: text_prefix, params: {max_tree_size: 1000000}}]
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from router.plugins.base import Scorer, ScorerOutput
from router.plugins.registry import register
from router.replica_state import ReplicaSnapshot, RoutingRequest
from router.text_prefix_tree import TextPrefixTree


class TextPrefixParams(BaseModel):
    """Parameters of the `text_prefix` scorer."""

    model_config = ConfigDict(extra="forbid")
    eviction_interval_s: float = Field(default=120.0, ge=0.0)
    max_tree_size: int = Field(default=67_108_864, ge=1)


@register
class TextPrefixScorer(Scorer[TextPrefixParams]):
    """Matched fraction of the prompt text; more wins. State: the text tree."""

    name = "text_prefix"
    params_model = TextPrefixParams
    needs_prompt_text = True

    def __init__(self, params: TextPrefixParams) -> None:
        super().__init__(params)
        self.tree = TextPrefixTree()
        self._last_eviction: float | None = None

    def score(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> ScorerOutput:
        text = request.prompt_text or ""
        matched = self.tree.match(text) if text else {}
        scores: dict[str, float] = {}
        terms: dict[str, dict[str, float]] = {}
        for r in candidates:
            rid = r.replica_id
            scores[rid] = (matched.get(rid, 0) / len(text)) if text else 0.0
            terms[rid] = {"match_rate": scores[rid], "tree_chars": float(self.tree.size(rid))}
        return ScorerOutput(scores, terms)

    def on_request_routed(self, request: RoutingRequest, replica_id: str, now: float) -> None:
        params = self.params
        self.tree.insert(request.prompt_text or "", replica_id, now)
        if self._last_eviction is None:
            self._last_eviction = now
        elif now - self._last_eviction >= params.eviction_interval_s:
            self.tree.evict_tenant_by_size(params.max_tree_size)
            self._last_eviction = now

    def on_replica_removed(self, replica_id: str, now: float) -> None:
        self.tree.remove_tenant(replica_id)
