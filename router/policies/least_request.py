"""`least_request`: send to the replica with the fewest requests in flight.

Formula: `load(r) = requests_in_flight(r)` (requests this router sent and has not seen finish;
SGLang's `worker.load()`), or with `load: engine`, `num_running(r) + num_waiting(r)` from the
last `/metrics` scrape. `chosen = argmin load`, ties to the lowest replica id.

Parameters (default): `load` (`router`): which count to use.

Example YAML::

    decode: {name: least_request, params: {load: engine}}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from router.policies.base import Policy, healthy_only
from router.policies.registry import register
from router.replica_state import PolicyDecision, ReplicaSnapshot, RoutingRequest


class LeastRequestParams(BaseModel):
    """Parameters of `least_request`."""

    model_config = ConfigDict(extra="forbid")
    load: Literal["router", "engine"] = "router"


def request_load(replica: ReplicaSnapshot, source: str) -> int:
    """The request count `least_request` compares."""
    if source == "engine":
        return replica.num_running + replica.num_waiting
    return replica.requests_in_flight


@register("least_load")
class LeastRequestPolicy(Policy[LeastRequestParams]):
    """Fewest requests in flight wins."""

    name = "least_request"
    params_model = LeastRequestParams

    def pick(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> PolicyDecision:
        params = self.params
        healthy, rejected = healthy_only(replicas)
        if not healthy:
            return self._no_healthy(replicas)
        scores = {r.replica_id: float(request_load(r, params.load)) for r in healthy}
        chosen = min(scores, key=lambda rid: (scores[rid], rid))
        return PolicyDecision(
            policy=self.name,
            chosen=chosen,
            reason=f"fewest requests ({scores[chosen]:.0f}, source={params.load})",
            scores=scores,
            higher_is_better=False,
            rejected=rejected,
        )
