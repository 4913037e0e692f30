"""The one interface every routing policy implements.

Shaped after Ray Serve's `RequestRouter`: a tiny surface that hides how a policy keeps state.

- `pick(request, replicas, now)` is pure with respect to the fleet: it reads the request and the
  replica snapshots and returns a `PolicyDecision` (choice, reason, every candidate's score). It
  does not change the policy's own state either, so a decision can be explained or re-run.
- `score(request, replicas, now)` returns just the per-replica scores, without side effects.
- `on_request_routed(request, replica_id, now)` is where a stateful policy learns what was
  actually sent where (round-robin's counter, `cache_aware`'s text tree).
- `on_replica_removed(replica_id, now)` forgets a replica.
- `route(...)` = `pick` + `on_request_routed` for callers that always send where they pick.

Policies with several scorers (llm-d) take `weights` from the config, never hard-coded in a
scorer; `scorer_names` lists the weights a policy accepts. Policies that sample take a seeded
`random.Random`; none reads a clock.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar, Generic, TypeVar, cast

from pydantic import BaseModel, ConfigDict

from router.replica_state import PolicyDecision, ReplicaSnapshot, RoutingRequest


class NoParams(BaseModel):
    """Params model for policies without parameters (unknown keys are still errors)."""

    model_config = ConfigDict(extra="forbid")


P = TypeVar("P", bound=BaseModel)


class Policy(ABC, Generic[P]):
    """Base class of routing policies (see module docstring)."""

    params: P

    name: ClassVar[str] = ""
    params_model: ClassVar[type[BaseModel]] = NoParams
    scorer_names: ClassVar[tuple[str, ...]] = ()
    default_weights: ClassVar[Mapping[str, float]] = {}

    def __init__(
        self,
        params: BaseModel | Mapping[str, object] | None = None,
        weights: Mapping[str, float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if params is None:
            params = self.params_model()
        elif not isinstance(params, BaseModel):
            params = self.params_model.model_validate(dict(params))
        self.params = cast(P, params)
        unknown = set(weights or {}) - set(self.scorer_names)
        if unknown:
            raise ValueError(
                f"weights: unknown scorer(s) {sorted(unknown)} for policy {self.name!r}; "
                f"known: {list(self.scorer_names)}"
            )
        merged = dict(self.default_weights)
        merged.update(weights or {})
        self.weights: dict[str, float] = merged
        self.rng = rng if rng is not None else random.Random(0)
        self._setup()

    def _setup(self) -> None:
        """Initialise policy-specific state (subclasses override; called by `__init__`)."""
        return None

    @abstractmethod
    def pick(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> PolicyDecision:
        """Choose a replica for `request` among `replicas` (pure; see module docstring)."""

    def score(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> dict[str, float]:
        """Every healthy candidate's score as `pick` reads it (see `higher_is_better`).

        No side effects: a sampling policy overrides this so no random draw is consumed.
        """
        return self.pick(request, replicas, now).scores

    def on_request_routed(self, request: RoutingRequest, replica_id: str, now: float) -> None:
        """Learn that `request` was sent to `replica_id` (stateless policies ignore it)."""
        return None

    def on_replica_removed(self, replica_id: str, now: float) -> None:
        """Forget `replica_id` (stateless policies ignore it)."""
        return None

    def route(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> PolicyDecision:
        """`pick`, then record the choice with `on_request_routed`."""
        decision = self.pick(request, replicas, now)
        if decision.chosen is not None:
            self.on_request_routed(request, decision.chosen, now)
        return decision

    def _no_healthy(self, replicas: Sequence[ReplicaSnapshot]) -> PolicyDecision:
        return PolicyDecision(
            policy=self.name,
            chosen=None,
            reason="no healthy replica",
            rejected={r.replica_id: "unhealthy" for r in replicas},
        )


def healthy_only(
    replicas: Sequence[ReplicaSnapshot],
) -> tuple[list[ReplicaSnapshot], dict[str, str]]:
    """Split candidates into the healthy ones and a rejection map for the rest."""
    healthy = [r for r in replicas if r.healthy]
    rejected = {r.replica_id: "unhealthy" for r in replicas if not r.healthy}
    return healthy, rejected
