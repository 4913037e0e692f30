"""`llmd`: llm-d's default scheduling profile: weighted scorers, max-score pick.

Faithful to llm-d's inference scheduler (built on the Gateway API Inference Extension scorer
plugins). Formula: each scorer maps a replica to [0, 1]; the weights live in the config, not in the
scorers; the replica with the highest weighted sum wins:

    score(r) = w_prefix * prefix(r) + w_queue * queue(r) + w_kv * kv_utilization(r)

- `prefix(r) = overlap_blocks(r) / request_blocks` (the prefix-cache scorer: matched leading
  blocks over the request's blocks; 0 when the request has no full block).
- `queue(r) = (max_q - q(r)) / (max_q - min_q)` over the candidates, `q` = waiting requests
  (`vllm:num_requests_waiting`); 1.0 for everyone when all queues are equal (queue scorer's
  min-max normalisation).
- `kv_utilization(r) = 1 - kv_usage(r)` (`vllm:kv_cache_usage_perc` as a fraction).

Weights (defaults, llm-d's default profile): `prefix` 3, `queue` 2, `kv_utilization` 2.
Picker: max score; llm-d breaks ties at random, pdorch to the lowest replica id so a decision
replays exactly. Parameters: none besides the weights.

llm-d's own example: A (92% match, 2 queued) beats C (88%, 31 queued) and idle B (no match).

Example YAML::

    prefill:
      name: llmd
      weights: {prefix: 3, queue: 2, kv_utilization: 2}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from router.policies.base import NoParams, Policy, healthy_only
from router.policies.registry import register
from router.replica_state import PolicyDecision, ReplicaSnapshot, RoutingRequest


def prefix_score(request: RoutingRequest, replica: ReplicaSnapshot) -> float:
    """llm-d prefix-cache scorer: fraction of the request's blocks cached on the replica."""
    total = len(request.block_keys) or request.prompt_tokens // max(1, request.block_size)
    if total <= 0:
        return 0.0
    return min(1.0, replica.overlap_blocks / total)


def queue_scores(replicas: Sequence[ReplicaSnapshot]) -> dict[str, float]:
    """llm-d/GIE queue scorer: min-max normalised waiting queue, shorter is better."""
    queues = {r.replica_id: r.num_waiting for r in replicas}
    if not queues:
        return {}
    hi, lo = max(queues.values()), min(queues.values())
    if hi == lo:
        return dict.fromkeys(queues, 1.0)
    return {rid: (hi - q) / (hi - lo) for rid, q in queues.items()}


def kv_utilization_score(replica: ReplicaSnapshot) -> float:
    """llm-d/GIE KV-cache-utilization scorer: free fraction of the KV pool."""
    return 1.0 - min(1.0, max(0.0, replica.kv_usage))


@register("llm_d", "llm-d")
class LlmdPolicy(Policy[NoParams]):
    """Weighted sum of prefix, queue and KV-utilization scores; highest wins."""

    name = "llmd"
    scorer_names = ("prefix", "queue", "kv_utilization")
    default_weights: ClassVar[Mapping[str, float]] = {
        "prefix": 3.0,
        "queue": 2.0,
        "kv_utilization": 2.0,
    }

    def pick(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> PolicyDecision:
        healthy, rejected = healthy_only(replicas)
        if not healthy:
            return self._no_healthy(replicas)
        w = self.weights
        queue = queue_scores(healthy)
        details: dict[str, dict[str, float]] = {}
        scores: dict[str, float] = {}
        for r in healthy:
            terms = {
                "prefix": prefix_score(request, r),
                "queue": queue[r.replica_id],
                "kv_utilization": kv_utilization_score(r),
            }
            details[r.replica_id] = terms
            scores[r.replica_id] = sum(w[name] * value for name, value in terms.items())
        chosen = min(scores, key=lambda rid: (-scores[rid], rid))
        t = details[chosen]
        return PolicyDecision(
            policy=self.name,
            chosen=chosen,
            reason=(
                f"max score {scores[chosen]:.3f} = {w['prefix']:g}*{t['prefix']:.2f} + "
                f"{w['queue']:g}*{t['queue']:.2f} + {w['kv_utilization']:g}*"
                f"{t['kv_utilization']:.2f}"
            ),
            scores=scores,
            higher_is_better=True,
            details=details,
            rejected=rejected,
        )
