"""`cache_aware`: SGLang / vllm-router's approximate-tree policy with balance thresholds.

Faithful to SGLang router's `CacheAwarePolicy` (`sgl-router/src/policies/cache_aware.rs`).
Formula (a decision rule):

1. `load(r)` = requests in flight from this router to `r`. The system is **imbalanced** when
   both `max(load) - min(load) > balance_abs_threshold` and
   `max(load) > balance_rel_threshold * min(load)`; then the request goes to the replica with the
   smallest load (shortest queue).
2. Otherwise (balanced), match the prompt *text* against an approximate radix tree of the text
   this router sent to each replica (`router/text_prefix_tree.py`):
   `match_rate(r) = matched_chars(r) / len(text)`. If the best `match_rate > cache_threshold`
   the request goes to that replica (ties to the lowest replica id); otherwise to the replica
   with the **smallest tree** (most spare cache, by SGLang's proxy).
3. Whatever was chosen, the text is inserted under the chosen replica (`on_request_routed`),
   in both modes. Every `eviction_interval_s` (checked on routing, with `now`) each replica's
   tree share is trimmed to `max_tree_size` characters by LRU leaves.

Parameters (defaults as SGLang's router): `cache_threshold` 0.3, `balance_abs_threshold` 64,
`balance_rel_threshold` 1.5, `eviction_interval_s` 120, `max_tree_size` 67,108,864 chars.

Differences, on purpose: loads and matches consider healthy replicas only (SGLang takes
`max/min` over all workers and falls back to the first healthy one when the match is
unhealthy); eviction runs inline on routing with `now` instead of in a sleeping thread, because
decision code owns no clock.

Example YAML::

    prefill:
      name: cache_aware
      params: {cache_threshold: 0.3, balance_abs_threshold: 64, balance_rel_threshold: 1.5}
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from router.policies.base import Policy, healthy_only
from router.policies.registry import register
from router.replica_state import PolicyDecision, ReplicaSnapshot, RoutingRequest
from router.text_prefix_tree import TextPrefixTree


class CacheAwareParams(BaseModel):
    """Parameters of `cache_aware` (SGLang's defaults)."""

    model_config = ConfigDict(extra="forbid")
    cache_threshold: float = Field(default=0.3, ge=0.0, le=1.0)
    balance_abs_threshold: int = Field(default=64, ge=0)
    balance_rel_threshold: float = Field(default=1.5, ge=1.0)
    eviction_interval_s: float = Field(default=120.0, ge=0.0)
    max_tree_size: int = Field(default=67_108_864, ge=1)


@register("cacheaware")
class CacheAwarePolicy(Policy[CacheAwareParams]):
    """Approximate text-tree affinity when balanced, shortest queue when imbalanced."""

    name = "cache_aware"
    params_model = CacheAwareParams

    def _setup(self) -> None:
        self.tree = TextPrefixTree()
        self._last_eviction: float | None = None

    def is_imbalanced(self, loads: Sequence[int]) -> bool:
        """SGLang's rule: both the absolute and the relative gap exceed their thresholds."""
        params = self.params
        if not loads:
            return False
        hi, lo = max(loads), min(loads)
        return hi - lo > params.balance_abs_threshold and hi > lo * params.balance_rel_threshold

    def pick(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> PolicyDecision:
        params = self.params
        healthy, rejected = healthy_only(replicas)
        if not healthy:
            return self._no_healthy(replicas)
        loads = {r.replica_id: r.requests_in_flight for r in healthy}
        text = request.prompt_text or ""
        matched = self.tree.match(text) if text else {}
        details = {
            r.replica_id: {
                "load": float(loads[r.replica_id]),
                "match_rate": (matched.get(r.replica_id, 0) / len(text)) if text else 0.0,
                "tree_chars": float(self.tree.size(r.replica_id)),
            }
            for r in healthy
        }
        if self.is_imbalanced(list(loads.values())):
            chosen = min(loads, key=lambda rid: (loads[rid], rid))
            reason = (
                f"imbalanced (max {max(loads.values())}, min {min(loads.values())}): shortest queue"
            )
            scores = {rid: float(load) for rid, load in loads.items()}
            higher = False
        else:
            rates = {rid: d["match_rate"] for rid, d in details.items()}
            best = min(rates, key=lambda rid: (-rates[rid], rid))
            if rates[best] > params.cache_threshold:
                chosen = best
                reason = (
                    f"balanced: highest match rate {rates[best]:.2f} > {params.cache_threshold}"
                )
                scores = rates
                higher = True
            else:
                sizes = {rid: d["tree_chars"] for rid, d in details.items()}
                chosen = min(sizes, key=lambda rid: (sizes[rid], rid))
                reason = (
                    f"balanced: best match rate {rates[best]:.2f} <= {params.cache_threshold}: "
                    "smallest tree"
                )
                scores = sizes
                higher = False
        return PolicyDecision(
            policy=self.name,
            chosen=chosen,
            reason=reason,
            scores=scores,
            higher_is_better=higher,
            details=details,
            rejected=rejected,
        )

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
