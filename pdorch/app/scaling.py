"""`ScalingControl`: the coordinator's handle on its actuator, pins and autoscaler decisions.

One per coordinator whose fleet launches engines (`run_coordinator` makes it; `None` for a
fleet of static endpoints). The admin API (`admin_scale.py`) and the in-process control loop
(`pdorch/autoscaler/`) both go through it:

- `set(pool, replicas=N | delta=±k, source=...)`: `source="manual"` (an operator, `pdorch
  scale set`) scales and **pins** the pool at N: the autoscaler's requests for a pinned pool
  are recorded with reason `pinned` and not applied, until `auto(pool)` (`pdorch scale auto`)
  hands it back. `source="autoscaler"` scales only unpinned pools and records the decision
  (its reason and inputs) for `GET /admin/autoscale`.
- `move(replica, to_pool)`: a role switch by hand.
- `view()`: per pool ready/pending/draining (the actuator's `current()`), `recalled` (draining
  replicas a scale-up took back so far), pinned count, last desired count; the last
  decisions (newest last, at most `max_decisions`).

Errors are `ApiError`s that name the problem: unknown pool 404; a count below `min`, above
`max` or over the GPU budget 400 (`autoscale.actuators.base.ActuatorError`'s message).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from autoscale.actuators.base import ActuatorError
from autoscale.actuators.local import LocalActuator, UnknownPoolError
from pdorch.app.errors import ApiError


class ScalingControl:
    """See the module docstring."""

    def __init__(
        self,
        actuator: LocalActuator,
        clock: Callable[[], float] = time.monotonic,
        max_decisions: int = 100,
    ) -> None:
        self.actuator = actuator
        self.clock = clock
        self.pinned: dict[str, int] = {}
        self.desired: dict[str, int] = {}
        self.decisions: deque[dict[str, Any]] = deque(maxlen=max_decisions)
        self.decision_reasons: Counter[tuple[str, str]] = Counter()  # (pool, reason)
        self.autoscaler: str | None = None  # who drives it: "in-process", "remote", None
        # pool → the last observed p90 TTFT/ITL (s) the autoscaler sent with a decision, and
        # when (`clock`): `GET /admin/autoscale` shows them while fresh, else its own
        self.observed: dict[str, dict[str, Any]] = {}
        self.observed_at: dict[str, float] = {}

    def _pool(self, pool: str) -> str:
        if pool not in self.actuator.pools():
            raise ApiError(
                404,
                f"Unknown pool {pool!r}; pools: {', '.join(self.actuator.pools())}.",
                code="unknown_pool",
                param="pool",
            )
        return pool

    def set(
        self,
        pool: str,
        *,
        replicas: int | None = None,
        delta: int | None = None,
        source: str = "manual",
        reason: str | None = None,
        inputs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Scale `pool` (see the module docstring); returns what was done."""
        pool = self._pool(pool)
        if (replicas is None) == (delta is None):
            raise ApiError(400, "Give exactly one of `replicas` or `delta`.", param="replicas")
        have = self.actuator.status(pool).provisioned
        target = replicas if replicas is not None else have + (delta or 0)
        now = self.clock()
        if source == "autoscaler":
            self.autoscaler = self.autoscaler or "remote"
            applied = pool not in self.pinned
            why = reason or "autoscaler"
            self._record(pool, target, why if applied else "pinned", inputs or {}, now, have)
            observed = (inputs or {}).get("observed")
            if isinstance(observed, dict):
                self.observed[pool] = observed
                self.observed_at[pool] = now
            if not applied:
                return {
                    "pool": pool,
                    "replicas": self.pinned[pool],
                    "applied": False,
                    "pinned": True,
                    "reason": "pinned",
                }
        try:
            if target != have:
                self.actuator.scale(pool, target, now)
            else:
                self.actuator.check(pool, target)
        except UnknownPoolError as err:
            raise ApiError(404, f"{err}.", code="unknown_pool", param="pool") from None
        except ActuatorError as err:
            raise ApiError(400, f"{err}.", code="invalid_scale", param="replicas") from None
        if source != "autoscaler":
            self.pinned[pool] = target
        self.desired[pool] = target
        return {
            "pool": pool,
            "replicas": target,
            "applied": True,
            "pinned": pool in self.pinned,
            "reason": reason or source,
        }

    def auto(self, pool: str) -> dict[str, Any]:
        pool = self._pool(pool)
        was = self.pinned.pop(pool, None)
        return {"pool": pool, "pinned": False, "was_pinned_at": was}

    def move(self, replica_id: str, to_pool: str) -> dict[str, Any]:
        to_pool = self._pool(to_pool)
        replica = self.actuator.fleet.get(replica_id)
        if replica is None:
            raise ApiError(404, f"Unknown replica {replica_id!r}.", param="replica")
        try:
            self.actuator.switch_role(replica_id, to_pool, self.clock())
        except ActuatorError as err:
            raise ApiError(400, f"{err}.", code="invalid_move", param="replica") from None
        return {
            "replica": replica_id,
            "from_pool": replica.pool,
            "to_pool": to_pool,
            "state": "draining",
        }

    def _record(
        self, pool: str, target: int, reason: str, inputs: dict[str, Any], now: float, have: int
    ) -> None:
        self.decision_reasons[(pool, reason)] += 1
        self.decisions.append(
            {
                "at_s": round(now, 3),
                "pool": pool,
                "from": have,
                "desired": target,
                "reason": reason,
                "inputs": inputs,
            }
        )

    def last_decision(self, pool: str) -> dict[str, Any] | None:
        for decision in reversed(self.decisions):
            if decision["pool"] == pool:
                return dict(decision)
        return None

    def view(self) -> dict[str, Any]:
        pools: dict[str, Any] = {}
        for pool, status in self.actuator.current().items():
            name = str(pool)
            pools[name] = {
                "ready": status.ready,
                "pending": status.pending,
                "draining": status.draining,
                "recalled": self.actuator.stats.recalls.get(name, 0),
                "pinned": self.pinned.get(name),
                "desired": self.desired.get(name),
                "min": self.actuator.limits(name).min,
                "max": self.actuator.limits(name).max,
                "last_decision": self.last_decision(name),
            }
        return {
            "autoscaler": self.autoscaler,
            "pools": pools,
            "decisions": list(self.decisions),
        }
