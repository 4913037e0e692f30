"""`dynamo`: NVIDIA Dynamo KV router's cost, lowest cost or softmax sampling.

Faithful to the `DefaultWorkerSelector` of Dynamo's KV router (Rust, `kv_router` scheduling):
Dynamo's `ActiveSequences` book every routed request on its worker until it completes, as
*active prefill tokens* (its uncached prompt tokens, until its prefill is done) and as *active
blocks*; a worker's potential load is its active load plus this request's. Formula:

    prefill_blocks(r) = (prefill_tokens_queued(r) + uncached(r)) / block_size
    uncached(r)       = max(0, prompt_tokens - overlap_blocks(r) * block_size)
    decode_blocks(r)  = decode_blocks_active(r) + request_blocks    ("potential" active blocks)
    cost(r)           = overlap_score_weight * prefill_blocks(r) + decode_blocks(r)

`prefill_tokens_queued(r)` is pdorch's token load: the uncached prompt tokens of the requests
in flight on `r` whose prefill is not done (Dynamo's active prefill tokens); without it a pure
prefill replica of a P/D fleet, which never holds decode blocks, would look idle however long
its queue, and every prefill would pile onto one replica. `decode_blocks_active(r)` is the
snapshot's `decode_blocks` (KV blocks of the sequences `r` decodes).

- `temperature == 0`: the lowest cost wins; ties go to the replica with the smaller cached tree
  (`cached_blocks`, Dynamo's tie-break), then (pdorch, instead of Dynamo's random pick) to the
  lowest replica id.
- `temperature > 0`: costs are min-max normalised and sampled with
  `p(r) ∝ exp(-(cost(r) - min) / ((max - min) * temperature))` (uniform when all costs are
  equal), using the policy's seeded `random.Random` (one draw per pick, replicas in id order),
  so a seed reproduces the sequence of choices.

Parameters (defaults, Dynamo's): `overlap_score_weight` 1.0 (higher favours TTFT, lower ITL),
`temperature` 0.0, `seed` (None: the RNG passed in, else `random.Random(0)`).
Simplifications: Dynamo deduplicates blocks shared with active sequences when it counts the
request's potential blocks; pdorch adds `request_blocks` to every replica, which shifts all
costs equally and so changes no choice. Dynamo's active blocks also hold the prompt blocks of
requests still prefilling (on a prefill worker: every in-flight prefill); pdorch counts them
only through `prefill_blocks` (their uncached part), as the router's token load does not
track the cached part of a queued prompt.

Example YAML::

    prefill: {name: dynamo, params: {overlap_score_weight: 1.0, temperature: 0.0}}
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from router.policies.base import Policy, healthy_only
from router.policies.registry import register
from router.replica_state import PolicyDecision, ReplicaSnapshot, RoutingRequest


class DynamoParams(BaseModel):
    """Parameters of `dynamo` (Dynamo's defaults)."""

    model_config = ConfigDict(extra="forbid")
    overlap_score_weight: float = Field(default=1.0, ge=0.0)
    temperature: float = Field(default=0.0, ge=0.0)
    seed: int | None = None


def softmax_probabilities(costs: Mapping[str, float], temperature: float) -> dict[str, float]:
    """Dynamo's normalised softmax over negated costs (lower cost, higher probability)."""
    lo, hi = min(costs.values()), max(costs.values())
    if hi == lo:
        return dict.fromkeys(costs, 1.0 / len(costs))
    scale = 1.0 / ((hi - lo) * temperature)
    weights = {rid: math.exp(-(c - lo) * scale) for rid, c in costs.items()}
    total = sum(weights.values())
    return {rid: w / total for rid, w in weights.items()}


@register("kv_router")
class DynamoPolicy(Policy[DynamoParams]):
    """Lowest `w * prefill_blocks + decode_blocks`, or softmax-sampled with a temperature."""

    name = "dynamo"
    params_model = DynamoParams

    def _setup(self) -> None:
        if self.params.seed is not None:
            self.rng = random.Random(self.params.seed)

    def _costs(
        self, request: RoutingRequest, healthy: Sequence[ReplicaSnapshot]
    ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        bs = max(1, request.block_size)
        request_blocks = request.prompt_blocks
        weight = self.params.overlap_score_weight
        costs: dict[str, float] = {}
        details: dict[str, dict[str, float]] = {}
        for r in sorted(healthy, key=lambda r: r.replica_id):
            queued = r.prefill_tokens_queued
            prefill_blocks = (queued + request.uncached_tokens(r.overlap_blocks)) / bs
            decode_blocks = float(r.decode_blocks + request_blocks)
            costs[r.replica_id] = weight * prefill_blocks + decode_blocks
            details[r.replica_id] = {
                "prefill_blocks": prefill_blocks,
                "queued_prefill_tokens": float(queued),
                "decode_blocks": decode_blocks,
                "overlap_blocks": float(r.overlap_blocks),
            }
        return costs, details

    def score(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> dict[str, float]:
        """Every healthy replica's cost (lower is better); consumes no random draw."""
        healthy, _ = healthy_only(replicas)
        return self._costs(request, healthy)[0]

    def pick(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> PolicyDecision:
        params = self.params
        healthy, rejected = healthy_only(replicas)
        if not healthy:
            return self._no_healthy(replicas)
        costs, details = self._costs(request, healthy)
        if params.temperature == 0.0:
            cached = {r.replica_id: r.cached_blocks for r in healthy}
            chosen = min(costs, key=lambda rid: (costs[rid], cached[rid], rid))
            reason = f"lowest cost {costs[chosen]:.2f}"
        else:
            probs = softmax_probabilities(costs, params.temperature)
            for rid, p in probs.items():
                details[rid]["probability"] = p
            sample = self.rng.random()
            cumulative = 0.0
            chosen = next(reversed(probs))
            for rid, p in probs.items():
                cumulative += p
                if sample <= cumulative:
                    chosen = rid
                    break
            reason = (
                f"softmax sample {sample:.3f} (T={params.temperature:g}): cost "
                f"{costs[chosen]:.2f}, p={probs[chosen]:.3f}"
            )
        return PolicyDecision(
            policy=self.name,
            chosen=chosen,
            reason=reason
            + f" = {params.overlap_score_weight:g}*{details[chosen]['prefill_blocks']:.2f}"
            + f" + {details[chosen]['decode_blocks']:.0f}",
            scores=costs,
            higher_is_better=False,
            details=details,
            rejected=rejected,
        )
