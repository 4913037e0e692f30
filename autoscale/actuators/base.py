"""The one interface every actuator implements, so one control loop drives any of them.

An actuator hides where replicas live. `current()` reports each pool's ready / pending /
draining counts; `scale(pool, n, now)` asks for `n` provisioned (ready + pending) replicas:
above the current count it starts replicas (pending until they are ready to route), below it
it drains replicas (out of routing at once, in-flight work finishes, bounded by the pool's
`drain_timeout_s`, then the replica stops); `switch_role(replica, to_pool, now)` moves a
role-agnostic replica (vLLM `kv_both`, a simulated engine in role `both`) to the other pool
after draining its current-role work. `apply(decision, now)` is the control loop's one call:
role moves first, then counts. Every call takes `now`, so the fleet simulator's actuator runs
in virtual time and the live ones in real time with the same loop.

A scale-up should take back draining replicas before it cold-starts (the recall rule,
`autoscale/README.md` "Recall": the pool's own draining replicas first, then with role
switching the other pool's, then cold starts). The simulator's actuator follows it; the
Kubernetes actuator undrains late (`settle_s`); the local one does not yet.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

from autoscale.decision import ScaleDecision
from autoscale.policy import PoolLimits
from autoscale.signals import Pool, PoolStatus

PoolKey = Pool | str
"""A key of `Actuator.current()`: `Pool` for the pools a planner sizes (prefill, decode), the
plain name for any other pool (colocated, custom). `Pool` is a StrEnum, so both hash and compare
as their names: `current().get("prefill")` and `current().get(Pool.PREFILL)` find the same."""


def pool_key(pool: str) -> PoolKey:
    """`Pool` for prefill/decode; other pool names (colocated, custom) pass through as plain
    strings, so `current()` can key every pool the fleet has. One rule for every actuator."""
    try:
        return Pool(pool)
    except ValueError:
        return pool


class ActuatorError(RuntimeError):
    """A request the actuator cannot carry out (unknown pool or replica, over a limit)."""


def check_count(
    pool: str,
    replicas: int,
    *,
    limits_of: Callable[[str], PoolLimits],
    provisioned_of: Callable[[str], int],
    pools: Iterable[str],
    gpu_budget: int | None,
) -> None:
    """ActuatorError unless `pool` may have `replicas`: within its min/max, and the GPUs of
    every pool (the others at their provisioned counts) within `gpu_budget`. One rule for every
    actuator, so `pdorch scale set` refuses the same counts locally and on Kubernetes."""
    limits = limits_of(pool)
    if replicas < limits.min:
        raise ActuatorError(f"pool {pool!r}: {replicas} replicas is below its min of {limits.min}")
    if replicas > limits.max:
        raise ActuatorError(f"pool {pool!r}: {replicas} replicas is above its max of {limits.max}")
    if gpu_budget is None:
        return
    gpus = replicas * limits.gpus_per_replica + sum(
        provisioned_of(other) * limits_of(other).gpus_per_replica
        for other in pools
        if other != pool
    )
    if gpus > gpu_budget:
        raise ActuatorError(
            f"pool {pool!r}: {replicas} replicas would use {gpus} GPUs, over the "
            f"gpu_budget of {gpu_budget}"
        )


class Actuator(ABC):
    """Base class of actuators (see module docstring)."""

    @abstractmethod
    def current(self) -> dict[PoolKey, PoolStatus]:
        """Ready / pending / draining replicas per pool, as of the last call."""

    @abstractmethod
    def scale(self, pool: Pool, replicas: int, now: float) -> None:
        """Make `pool` provisioned with `replicas` (ready + pending)."""

    @abstractmethod
    def switch_role(self, replica_id: str, to_pool: Pool, now: float) -> None:
        """Move one replica to `to_pool` without a restart (drain first)."""

    @abstractmethod
    def switchable(self, pool: Pool) -> list[str]:
        """Replicas of `pool` that may switch role (role-agnostic and ready)."""

    def apply(self, decision: ScaleDecision, now: float) -> None:
        """Role moves first (a move is capacity in seconds), then the desired counts."""
        for move in decision.moves:
            for replica_id in self.switchable(move.from_pool)[: move.count]:
                self.switch_role(replica_id, move.to_pool, now)
        for pool, replicas in decision.desired.items():
            if self.current().get(pool, PoolStatus()).provisioned != replicas:
                self.scale(pool, replicas, now)
