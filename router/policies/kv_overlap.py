"""`kv_overlap`: pure maximum cached overlap (the baseline that hot-spots).

Formula: `chosen = argmax overlap_blocks(r)` over healthy replicas, ties to the lowest replica
id. No load signal at all: every request sharing a popular prefix lands on the one replica that
holds it, however long its queue (the failure mode Ray Serve LLM's RL-rollout study and llm-d's
prefix-only benchmark show). Parameters: none.

Example YAML::

    prefill: {name: kv_overlap}
"""

from __future__ import annotations

from collections.abc import Sequence

from router.policies.base import NoParams, Policy, healthy_only
from router.policies.registry import register
from router.replica_state import PolicyDecision, ReplicaSnapshot, RoutingRequest


@register("prefix_only")
class KvOverlapPolicy(Policy[NoParams]):
    """Most leading blocks of the prompt cached wins."""

    name = "kv_overlap"

    def pick(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> PolicyDecision:
        healthy, rejected = healthy_only(replicas)
        if not healthy:
            return self._no_healthy(replicas)
        scores = {r.replica_id: float(r.overlap_blocks) for r in healthy}
        chosen = min(scores, key=lambda rid: (-scores[rid], rid))
        return PolicyDecision(
            policy=self.name,
            chosen=chosen,
            reason=f"max overlap {scores[chosen]:.0f} of {request.prompt_blocks} blocks",
            scores=scores,
            higher_is_better=True,
            rejected=rejected,
        )
