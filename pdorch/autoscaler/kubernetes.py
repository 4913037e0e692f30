"""`pdorch autoscale --actuator kubernetes`: the control loop scales the cluster itself.

The default (`--actuator coordinator`) sends each decision to the coordinator's admin API and
the coordinator's own actuator carries it out. On Kubernetes the engines are Deployments the
coordinator does not own, so this process drives `autoscale.actuators.kubernetes.
KubernetesActuator` directly:

- `KubernetesCounts`: the loop's pool counts are the actuator's `current()` after a fresh
  `refresh()` (pods and Deployment counts read from the API server every tick);
- `KubernetesDriver`: role moves first, then each pool's desired count, one call at a time; a
  refused call (min/max, GPU budget, not role-agnostic) is logged and the rest still applied.
  With `wait=True` (`--once`) it waits for the started drains and patches to finish.

Drains go to every coordinator in `--drain-url` (`POST /admin/replicas/{pod}/drain`).
"""

from __future__ import annotations

import logging
from typing import Any

from autoscale.actuators.base import ActuatorError
from autoscale.actuators.kubernetes import KubernetesActuator
from autoscale.decision import ScaleDecision
from autoscale.signals import Observation, Pool, PoolStatus
from pdorch.autoscaler.source import counts_of

log = logging.getLogger(__name__)


class KubernetesCounts:
    def __init__(self, actuator: KubernetesActuator) -> None:
        self.actuator = actuator

    async def read(self) -> dict[Pool, PoolStatus]:
        await self.actuator.refresh()
        rows: dict[str, Any] = {
            str(pool): {"ready": s.ready, "pending": s.pending, "draining": s.draining}
            for pool, s in self.actuator.current().items()
        }
        return counts_of(rows)

    async def aclose(self) -> None:
        return None


class KubernetesDriver:
    def __init__(self, actuator: KubernetesActuator, wait: bool = False) -> None:
        self.actuator = actuator
        self.wait = wait

    async def apply(self, decision: ScaleDecision, obs: Observation) -> None:
        del obs
        now = self.actuator.clock()
        for move in decision.moves:
            for replica_id in self.actuator.switchable(move.from_pool)[: move.count]:
                try:
                    self.actuator.switch_role(replica_id, move.to_pool, now)
                except ActuatorError as err:
                    log.warning("move %s refused: %s", replica_id, err)
        for pool, replicas in decision.desired.items():
            if self.actuator.status(str(pool)).provisioned == replicas:
                continue
            try:
                self.actuator.scale(pool, replicas, now)
            except ActuatorError as err:
                log.warning("scale %s to %d refused: %s", pool, replicas, err)
        if self.wait:
            await self.actuator.idle()
