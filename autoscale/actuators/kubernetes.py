"""`KubernetesActuator`: scales the engine Deployments of a cluster through the `scale` subresource.

Configured by the fleet YAML's `discovery:` section (`pools/kubernetes/settings.py`): the
namespace, each pool's pod `label_selector` and the `deployment` that owns its pods. What it
does, per `Actuator` call:

- `current()`: per pool, from the last `refresh()` (one pod list and one `GET .../scale` per
  pool): `ready` = pods Ready, not terminating, not being drained by us; `pending` = pods not
  Ready and not terminating (scheduled or starting: capacity that is coming) plus replicas the
  Deployment asks for that have no pod yet (`spec.replicas` - live pods); `draining` = pods we
  are draining plus terminating pods.
- `scale(pool, n)`: checked first (pool known, `min`/`max` of the SLO policy, the policy's
  `gpu_budget` over every pool's provisioned replicas x `gpus_per_replica`; else
  `ActuatorError`), then in the background:
  - up: `PATCH .../deployments/{name}/scale` `{"spec": {"replicas": n}}` (merge patch); the
    new pods count as pending until Ready;
  - down: surplus = provisioned - n. Pods not Ready go first (the ReplicaSet deletes those
    before Ready ones anyway, nothing to drain); for each Ready pod still to remove (the
    newest first), **drain** it through the coordinator(s) (`drainer`, `POST
    /admin/replicas/{pod}/drain`: out of routing, in-flight requests finish within the pool's
    `drain_timeout_s`), set its `controller.kubernetes.io/pod-deletion-cost` to
    `DRAINED_DELETION_COST` (the ReplicaSet removes the lowest cost first, so the drained pod
    is the one that goes), **then** patch the count. If a drained pod is still there and not
    terminating `settle_s` later (someone raised the count again, the controller chose
    otherwise), its drain is cancelled so it serves again.
- `switch_role(pod, to_pool)`: only for pods labelled role-agnostic (`role_label` =
  `kv_both` / `both`; else `ActuatorError` naming the label): drain it, rewrite its
  `pool_label` to `to_pool` (the receiving pool's selector now matches it: discovery moves the
  replica, no restart), then lower the giving Deployment by one so its ReplicaSet does not
  start a replacement. The moved pod is then owned by no Deployment (it keeps the old
  ReplicaSet's template hash); it serves until it is deleted.

One background task per pool at a time (requests queue behind it); `idle()` awaits them. A
failed task is logged and counted (`stats.errors`); the next tick's `current()` shows what is.
`now` is taken for the interface; live work runs on `clock`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from autoscale.actuators.background import BackgroundWork
from autoscale.actuators.base import Actuator, ActuatorError, PoolKey, check_count, pool_key
from autoscale.policy import PoolLimits, SloPolicy
from autoscale.signals import Pool, PoolStatus
from pools.http_client import http_client
from pools.kubernetes.api import KubeApi
from pools.kubernetes.pods import PodView, pod_view, routable, switchable
from pools.kubernetes.settings import KubernetesDiscoverySettings

log = logging.getLogger(__name__)

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
DRAINED_DELETION_COST = -1_000_000  # below any cost an operator sets by hand


class Drainer(Protocol):
    async def drain(self, replica_id: str, timeout_s: float) -> None: ...

    async def cancel(self, replica_id: str) -> None: ...


class CoordinatorDrainer:
    """Drains through every coordinator's `POST /admin/replicas/{id}/drain` (each routes to
    the pod on its own, so each must stop). A 404 (that coordinator never saw the pod) is fine."""

    def __init__(self, urls: list[str], admin_token: str | None = None) -> None:
        headers = {"authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.urls = [u.rstrip("/") for u in urls]
        self.client = http_client(headers=headers, timeout=httpx.Timeout(10.0, read=3700.0))

    async def _post(self, replica_id: str, body: dict[str, object]) -> None:
        async def one(url: str) -> None:
            answer = await self.client.post(f"{url}/admin/replicas/{replica_id}/drain", json=body)
            if answer.status_code not in (200, 404):
                raise ActuatorError(
                    f"{url}: drain {replica_id}: {answer.status_code} {answer.text}"
                )

        await asyncio.gather(*(one(url) for url in self.urls))

    async def drain(self, replica_id: str, timeout_s: float) -> None:
        await self._post(replica_id, {"timeout_s": timeout_s})

    async def cancel(self, replica_id: str) -> None:
        await self._post(replica_id, {"cancel": True})

    async def aclose(self) -> None:
        await self.client.aclose()


@dataclass
class KubernetesActuatorStats:
    patches: list[tuple[str, int]] = field(default_factory=list)  # (deployment, replicas)
    drained: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    moved: list[tuple[str, str]] = field(default_factory=list)  # (pod, to pool)
    errors: int = 0


class KubernetesActuator(Actuator):
    """See the module docstring."""

    def __init__(
        self,
        settings: KubernetesDiscoverySettings,
        drainer: Drainer,
        *,
        policy: SloPolicy | None = None,
        api: KubeApi | None = None,
        clock: Callable[[], float] = time.monotonic,
        settle_s: float = 60.0,
        poll_s: float = 0.2,
    ) -> None:
        self.settings = settings
        self.drainer = drainer
        self.policy = policy
        self.api = api or KubeApi(settings)
        self.clock = clock
        self.settle_s = settle_s
        self.poll_s = poll_s
        self.stats = KubernetesActuatorStats()
        self._pods: dict[str, list[PodView]] = {p: [] for p in self.pools()}
        self._spec: dict[str, int] = {}
        self._draining: dict[str, str] = {}  # pod → pool it leaves
        self._locks = {p: asyncio.Lock() for p in self.pools()}
        self._work = BackgroundWork()

    # ---- reading -----------------------------------------------------------------------------

    def pools(self) -> list[str]:
        return [name for name, pool in self.settings.pools.items() if pool.deployment]

    def deployment(self, pool: str) -> str:
        name = self.settings.pools[pool].deployment
        assert name is not None
        return name

    def limits(self, pool: str) -> PoolLimits:
        if self.policy is not None and pool in (Pool.PREFILL.value, Pool.DECODE.value):
            return self.policy.limits(Pool(pool))
        return PoolLimits()

    async def refresh(self) -> None:
        """Read every pool's pods and Deployment count (the basis of `current()`)."""
        for pool in self.pools():
            _, items = await self.api.list_pods(self.settings.pools[pool].label_selector)
            self._pods[pool] = [pod_view(p) for p in items]
            self._spec[pool] = await self.api.get_scale(self.deployment(pool))

    def status(self, pool: str) -> PoolStatus:
        pods = self._pods.get(pool, [])
        live = [p for p in pods if not p.terminating]
        ready = sum(1 for p in live if routable(p) and p.name not in self._draining)
        starting = sum(1 for p in live if not routable(p) and p.name not in self._draining)
        missing = max(0, self._spec.get(pool, len(live)) - len(live))
        ours = sum(1 for p in live if p.name in self._draining)
        return PoolStatus(
            ready=ready,
            pending=starting + missing,
            draining=ours + sum(1 for p in pods if p.terminating),
        )

    def current(self) -> dict[PoolKey, PoolStatus]:
        return {pool_key(pool): self.status(pool) for pool in self.pools()}

    def switchable(self, pool: Pool | str) -> list[str]:
        return [
            p.name
            for p in self._pods.get(str(pool), [])
            if routable(p) and p.name not in self._draining and switchable(p, self.settings)
        ]

    # ---- checks ------------------------------------------------------------------------------

    def check(self, pool: str, replicas: int) -> None:
        """ActuatorError unless `pool` may have `replicas` (known pool, min/max, GPU budget)."""
        if pool not in self.pools():
            raise ActuatorError(
                f"unknown pool {pool!r}; pools with a deployment: {', '.join(self.pools())}"
            )
        check_count(
            pool,
            replicas,
            limits_of=self.limits,
            provisioned_of=lambda other: self.status(other).provisioned,
            pools=self.pools(),
            gpu_budget=self.policy.gpu_budget if self.policy is not None else None,
        )

    # ---- acting ------------------------------------------------------------------------------

    def scale(self, pool: Pool | str, replicas: int, now: float) -> None:
        del now
        pool = str(pool)
        self.check(pool, replicas)
        status = self.status(pool)
        if replicas > status.provisioned:
            self._spec[pool] = self._spec.get(pool, 0) + replicas - status.provisioned
            self._spawn(self._scale_up(pool, replicas))
            return
        surplus = status.provisioned - replicas
        # pods not Ready leave first (the ReplicaSet's own order); drain Ready ones for the rest
        victims = sorted(
            (p for p in self._pods[pool] if routable(p) and p.name not in self._draining),
            key=lambda p: (p.created, p.name),
            reverse=True,
        )[: max(0, surplus - status.pending)]
        for pod in victims:
            self._draining[pod.name] = pool
        self._spawn(self._scale_down(pool, replicas, [p.name for p in victims]))

    def switch_role(self, replica_id: str, to_pool: Pool | str, now: float) -> None:
        del now
        to_pool = str(to_pool)
        found = [
            (pool, p) for pool, pods in self._pods.items() for p in pods if p.name == replica_id
        ]
        if not found:
            raise ActuatorError(f"unknown replica (pod) {replica_id!r}")
        from_pool, pod = found[0]
        if to_pool not in self.pools() or to_pool == from_pool:
            raise ActuatorError(
                f"cannot move {replica_id!r} from pool {from_pool!r} to {to_pool!r}"
            )
        if not switchable(pod, self.settings):
            role = pod.labels.get(self.settings.role_label, "")
            raise ActuatorError(
                f"pod {replica_id!r} cannot switch role: its label {self.settings.role_label}="
                f"{role!r} is not kv_both (or both for a simulated engine); only role-agnostic "
                "engines move between pools"
            )
        if not routable(pod) or replica_id in self._draining:
            raise ActuatorError(f"pod {replica_id!r} is not ready")
        self._draining[replica_id] = from_pool
        self._spawn(self._move(from_pool, replica_id, to_pool))

    async def idle(self, timeout_s: float = 600.0) -> None:
        """Wait until every scale patch, drain and move has finished."""
        await self._work.idle(timeout_s)

    async def aclose(self) -> None:
        await self._work.cancel()
        await self.api.aclose()

    # ---- background work ---------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        self._work.spawn(coro)

    async def _patch(self, pool: str, replicas: int) -> None:
        self._spec[pool] = await self.api.patch_scale(self.deployment(pool), replicas)
        self.stats.patches.append((self.deployment(pool), replicas))
        log.info("deployment %s scaled to %d", self.deployment(pool), replicas)

    async def _scale_up(self, pool: str, replicas: int) -> None:
        async with self._locks[pool]:
            try:
                await self._patch(pool, replicas)
            except Exception:
                self.stats.errors += 1
                log.exception("scaling %s up to %d failed", pool, replicas)

    async def _scale_down(self, pool: str, replicas: int, victims: list[str]) -> None:
        async with self._locks[pool]:
            try:
                timeout_s = self.limits(pool).drain_timeout_s
                await asyncio.gather(*(self._drain(pod, timeout_s) for pod in victims))
                await self._patch(pool, replicas)
                await self._settle(victims)
            except Exception:
                self.stats.errors += 1
                log.exception("scaling %s down to %d failed", pool, replicas)
                for pod in victims:
                    await self._undrain(pod)
            finally:
                for pod in victims:
                    self._draining.pop(pod, None)

    async def _drain(self, pod: str, timeout_s: float) -> None:
        await self.drainer.drain(pod, timeout_s)
        self.stats.drained.append(pod)
        await self.api.patch_pod_metadata(
            pod, annotations={DELETION_COST: str(DRAINED_DELETION_COST)}
        )

    async def _undrain(self, pod: str) -> None:
        try:
            await self.api.patch_pod_metadata(pod, annotations={DELETION_COST: None})
            await self.drainer.cancel(pod)
            self.stats.cancelled.append(pod)
        except Exception:  # the pod may be gone already: nothing left to undo
            log.debug("undrain %s", pod, exc_info=True)

    async def _settle(self, victims: list[str]) -> None:
        """Wait until each drained pod is gone or terminating; past `settle_s`, undrain it."""
        deadline = self.clock() + self.settle_s
        left = set(victims)
        while left:
            await self.refresh()
            alive = {p.name for pods in self._pods.values() for p in pods if not p.terminating}
            left &= alive
            if not left:
                return
            if self.clock() >= deadline:
                for pod in sorted(left):
                    log.warning("drained pod %s was not removed; it serves again", pod)
                    await self._undrain(pod)
                return
            await asyncio.sleep(self.poll_s)

    async def _move(self, from_pool: str, pod: str, to_pool: str) -> None:
        async with self._locks[from_pool]:
            try:
                await self.drainer.drain(pod, self.limits(from_pool).drain_timeout_s)
                await self.api.patch_pod_metadata(pod, labels={self.settings.pool_label: to_pool})
                self.stats.moved.append((pod, to_pool))
                spec = self._spec.get(from_pool)
                if spec is None:
                    spec = await self.api.get_scale(self.deployment(from_pool))
                await self._patch(from_pool, max(0, spec - 1))
                # the coordinators' discovery moves the replica (no restart), which ends its
                # drain; cancelling it here could route old-role work to it once more
                await self.refresh()
            except Exception:
                self.stats.errors += 1
                log.exception("moving %s to %s failed", pod, to_pool)
            finally:
                self._draining.pop(pod, None)
