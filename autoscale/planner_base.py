"""The one interface every planner implements (pdorch's own and the peers' baselines).

A planner is a deterministic, clock-free object: `plan(observation)` reads only the
observation (which carries `now`) and the planner's own history (stabilization windows,
predictor state), and returns a `ScaleDecision`. It does no I/O, so the same object runs in the
fleet simulator's virtual time and in the live control loop. `interval_s` is how often the
caller should ask; a caller may ask more often (the planner then holds).

Planners register by name (`register_planner`) so the CLI and the study can list them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from autoscale.decision import ScaleDecision
from autoscale.signals import Observation


class Planner(ABC):
    """Base class of planners (see module docstring)."""

    name: ClassVar[str] = ""
    interval_s: float = 5.0

    @abstractmethod
    def plan(self, observation: Observation) -> ScaleDecision:
        """Desired replicas per pool for `observation.now`."""


PlannerFactory = Callable[..., Planner]
_REGISTRY: dict[str, PlannerFactory] = {}


def register_planner(name: str, factory: PlannerFactory) -> None:
    if name in _REGISTRY:
        raise ValueError(f"planner {name!r} is already registered")
    _REGISTRY[name] = factory


def planner_factory(name: str) -> PlannerFactory:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown planner {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def planner_names() -> list[str]:
    return sorted(_REGISTRY)
