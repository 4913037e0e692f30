"""`round_robin`: the i-th routed request goes to healthy replica i mod N.

Formula: `chosen = healthy[counter mod len(healthy)]`, `counter` += 1 per routed request
(`on_request_routed`). Parameters: none. Faithful to vllm-router's / SGLang router's
`round_robin` (a counter over the healthy workers, no load or cache signal). Baseline only.

Example YAML::

    prefill: {name: round_robin}
"""

from __future__ import annotations

from collections.abc import Sequence

from router.policies.base import NoParams, Policy, healthy_only
from router.policies.registry import register
from router.replica_state import PolicyDecision, ReplicaSnapshot, RoutingRequest


@register("roundrobin")
class RoundRobinPolicy(Policy[NoParams]):
    """Cycle through healthy replicas in the order given."""

    name = "round_robin"

    def _setup(self) -> None:
        self._counter = 0

    def pick(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> PolicyDecision:
        healthy, rejected = healthy_only(replicas)
        if not healthy:
            return self._no_healthy(replicas)
        chosen = healthy[self._counter % len(healthy)].replica_id
        return PolicyDecision(
            policy=self.name,
            chosen=chosen,
            reason=f"turn {self._counter} of {len(healthy)} healthy replicas",
            scores={r.replica_id: float(r.replica_id == chosen) for r in healthy},
            higher_is_better=True,
            rejected=rejected,
        )

    def on_request_routed(self, request: RoutingRequest, replica_id: str, now: float) -> None:
        self._counter += 1
