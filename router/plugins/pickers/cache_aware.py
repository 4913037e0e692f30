"""`cache_aware`: SGLang / vllm-router's balance rule over `least_request` and `text_prefix`.

1. `load(r)` = the `least_request` score. **Imbalanced** iff
   `max(load) - min(load) > balance_abs_threshold` and `max(load) > balance_rel_threshold ·
   min(load)` → the least loaded replica (ties to the lowest id); reported scores: loads.
2. Balanced: the best `text_prefix` match rate (ties to the lowest id) if it is
   `> cache_threshold` (strict, as SGLang) → that replica; reported: match rates.
3. Otherwise → the replica with the smallest text tree (`tree_chars`: most spare cache, by
   SGLang's proxy; ties to the lowest id); reported: tree sizes.

The text is inserted under the chosen replica by `text_prefix.on_request_routed`, in every
branch. On purpose: loads and matches count the candidates that survived the filters (healthy
ones), where SGLang takes max/min over all workers.

Parameters (defaults, SGLang router's): `cache_threshold` 0.3, `balance_abs_threshold` 64,
`balance_rel_threshold` 1.5.

Example::

    picker: {name: cache_aware, params: {cache_threshold: 0.3, balance_abs_threshold: 64}}
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from router.plugins.base import Pick, Picker, Scored
from router.plugins.registry import register
from router.replica_state import ReplicaSnapshot, RoutingRequest


class CacheAwareParams(BaseModel):
    """Parameters of the `cache_aware` picker."""

    model_config = ConfigDict(extra="forbid")
    cache_threshold: float = Field(default=0.3, ge=0.0, le=1.0)
    balance_abs_threshold: int = Field(default=64, ge=0)
    balance_rel_threshold: float = Field(default=1.5, ge=1.0)


@register
class CacheAwarePicker(Picker[CacheAwareParams]):
    """Shortest queue when imbalanced, else best text match or smallest tree."""

    name = "cache_aware"
    params_model = CacheAwareParams
    required_scorers = ("least_request", "text_prefix")

    def is_imbalanced(self, loads: Sequence[float]) -> bool:
        """SGLang's rule: both the absolute and the relative gap exceed their thresholds."""
        params = self.params
        if not loads:
            return False
        hi, lo = max(loads), min(loads)
        return hi - lo > params.balance_abs_threshold and hi > lo * params.balance_rel_threshold

    def pick(
        self,
        request: RoutingRequest,
        candidates: Sequence[ReplicaSnapshot],
        scored: Scored,
        rng: random.Random,
        now: float,
    ) -> Pick:
        params = self.params
        loads = scored.by_scorer["least_request"]
        if self.is_imbalanced(list(loads.values())):
            chosen = min(loads, key=lambda rid: (loads[rid], rid))
            hi, lo = max(loads.values()), min(loads.values())
            return Pick(
                chosen,
                lambda: f"imbalanced (max {hi:.0f}, min {lo:.0f}): shortest queue",
                dict(loads),
                False,
            )
        rates = scored.by_scorer["text_prefix"]
        top = min(rates, key=lambda rid: (-rates[rid], rid))
        rate, threshold = rates[top], params.cache_threshold
        if rate > threshold:
            return Pick(
                top,
                lambda: f"balanced: highest match rate {rate:.2f} > {threshold}",
                dict(rates),
                True,
            )
        sizes = {rid: terms["tree_chars"] for rid, terms in scored.terms.items()}
        chosen = min(sizes, key=lambda rid: (sizes[rid], rid))
        return Pick(
            chosen,
            lambda: f"balanced: best match rate {rate:.2f} <= {threshold}: smallest tree",
            sizes,
            False,
        )
