"""`round_robin`: the rotation's turn scores 1, everyone else 0.

    turn     = candidates[counter mod len(candidates)]      (candidates in the order given)
    score(r) = 1.0 if r is turn else 0.0
    counter += 1 per routed request (`on_request_routed`)

Higher is better. As vllm-router's / SGLang's `round_robin`: a counter over the healthy
workers, no load or cache signal. Parameters (defaults): `count_session_keyed` (true): when
false the rotation advances only on requests without a session key, for a profile where a
session scorer places the keyed ones (`consistent_hash` with `fallback: round_robin`).

Example::

    scorers: [{name: round_robin}]
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from router.plugins.base import Scorer, ScorerOutput
from router.plugins.registry import register
from router.replica_state import ReplicaSnapshot, RoutingRequest


class RoundRobinParams(BaseModel):
    """Parameters of the `round_robin` scorer."""

    model_config = ConfigDict(extra="forbid")
    count_session_keyed: bool = True


@register
class RoundRobinScorer(Scorer[RoundRobinParams]):
    """1 for the rotation's turn; state: the counter."""

    name = "round_robin"
    params_model = RoundRobinParams

    def __init__(self, params: RoundRobinParams) -> None:
        super().__init__(params)
        self.counter = 0

    def score(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> ScorerOutput:
        if not candidates:
            return ScorerOutput({})
        turn = candidates[self.counter % len(candidates)].replica_id
        return ScorerOutput({r.replica_id: float(r.replica_id == turn) for r in candidates})

    def describe(self, terms: dict[str, float]) -> str:
        return f"turn {self.counter}"

    def on_request_routed(self, request: RoutingRequest, replica_id: str, now: float) -> None:
        if self.params.count_session_keyed or not request.session_key:
            self.counter += 1
