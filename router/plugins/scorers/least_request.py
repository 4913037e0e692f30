"""`least_request`: requests in flight on the replica.

    load(r) = requests_in_flight(r)               (`load: router`: sent by this router and not
                                                   seen finish; SGLang's `worker.load()`)
            = num_running(r) + num_waiting(r)     (`load: engine`: the last /metrics scrape)

Lower is better. Parameters (defaults): `load` (`router` | `engine`, `router`).

Example::

    scorers: [{name: least_request, params: {load: engine}}]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from router.plugins.base import Scorer, ScorerOutput
from router.plugins.registry import register
from router.replica_state import ReplicaSnapshot, RoutingRequest


class LeastRequestParams(BaseModel):
    """Parameters of the `least_request` scorer."""

    model_config = ConfigDict(extra="forbid")
    load: Literal["router", "engine"] = "router"


@register
class LeastRequestScorer(Scorer[LeastRequestParams]):
    """Request count; fewer wins."""

    name = "least_request"
    params_model = LeastRequestParams
    higher_is_better = False

    def score(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> ScorerOutput:
        if self.params.load == "engine":
            return ScorerOutput(
                {r.replica_id: float(r.num_running + r.num_waiting) for r in candidates}
            )
        return ScorerOutput({r.replica_id: float(r.requests_in_flight) for r in candidates})

    def describe(self, terms: dict[str, float]) -> str:
        return f"{terms[self.name]:.0f} requests (source={self.params.load})"
