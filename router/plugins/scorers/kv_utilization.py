"""`kv_utilization`: the free fraction of the replica's KV pool.

    kv_utilization(r) = 1 - clamp(kv_usage(r), 0, 1)     kv_usage = vllm:kv_cache_usage_perc

Higher is better, in [0, 1] (llm-d / GIE KV-cache-utilization scorer). No parameters.

Example::

    scorers: [{name: kv_utilization, weight: 2}]
"""

from __future__ import annotations

from collections.abc import Sequence

from router.plugins.base import NoParams, Scorer, ScorerOutput
from router.plugins.registry import register
from router.replica_state import ReplicaSnapshot, RoutingRequest


@register
class KvUtilizationScorer(Scorer[NoParams]):
    """Free KV fraction; more wins."""

    name = "kv_utilization"

    def score(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> ScorerOutput:
        return ScorerOutput(
            {r.replica_id: 1.0 - min(1.0, max(0.0, r.kv_usage)) for r in candidates}
        )
