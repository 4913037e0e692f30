"""`queue`: shorter waiting queue is better, min-max normalised over the candidates.

    queue(r) = (max_q - q(r)) / (max_q - min_q)       q = vllm:num_requests_waiting
             = 1.0 for every candidate when all queues are equal

Higher is better, in [0, 1] (llm-d / Gateway API Inference Extension queue scorer). No
parameters.

Example::

    scorers: [{name: queue, weight: 2}]
"""

from __future__ import annotations

from collections.abc import Sequence

from router.plugins.base import NoParams, Scorer, ScorerOutput
from router.plugins.registry import register
from router.replica_state import ReplicaSnapshot, RoutingRequest


@register
class QueueScorer(Scorer[NoParams]):
    """Min-max normalised waiting queue; shorter wins."""

    name = "queue"

    def score(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> ScorerOutput:
        queues = {r.replica_id: r.num_waiting for r in candidates}
        if not queues:
            return ScorerOutput({})
        hi, lo = max(queues.values()), min(queues.values())
        if hi == lo:
            return ScorerOutput(dict.fromkeys(queues, 1.0))
        return ScorerOutput({rid: (hi - q) / (hi - lo) for rid, q in queues.items()})
