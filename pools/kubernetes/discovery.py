"""`KubernetesDiscovery`: engine pods, watched by label selector per pool, kept in the fleet.

One task per configured pool runs the list-then-watch loop of a Kubernetes informer:

    list (labelSelector) → resourceVersion R, reconcile the pool with the listed pods
    watch from R (timeoutSeconds = watch_timeout_s, bookmarks on) → apply each event, R moves on
    the watch ends (server timeout)           → watch again from R
    410 Gone (R is older than the server keeps) → list again (a relist; nothing is lost: the
                                                 relist replaces the pool's view and every pod
                                                 whose state changed is reconciled)
    any other API or connection error (server restarting) → back off (backoff_initial_s,
                                                 doubling, capped at backoff_max_s), list again
                                                 (a restarted server may have lost its history;
                                                 a relist is never wrong, only dearer)

Reconciling one pod name (`_sync`) goes through the lifecycle the coordinator uses for
replicas added at run time (`pools.fleet.Fleet`, as the local actuator does):

- Ready, not terminating, with an IP, in pool P, not in the fleet → `Fleet.add_replica(...,
  pending=True)` (replica id = pod name, `pods.endpoint_of`), then admitted (`Fleet.admit`)
  once its `/health` answers 200 and `join_check(id)` (the coordinator follows its KV events)
  says yes;
- no longer routable in its pool (deleted, not Ready, terminating, relabelled out) → drained
  as every removal is (`pools.drain.drain_replica`: out of routing at once, in-flight requests
  finish within `drain_timeout_s`) and then removed; a pending one is removed at once. A pod
  Ready again in the same pool before its drain ends stays (drain cancelled); a role-agnostic
  pod relabelled into another discovered pool is moved there after its drain
  (`Fleet.move_replica`: no restart).

Replicas this class did not add (static endpoints, launched engines) are never touched.
`stats` counts lists, relists after 410, watch errors and membership changes (tests, logs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from pools.drain import RequestTracker, drain_replica
from pools.fleet import Fleet
from pools.kubernetes.api import KubeApi, is_gone, warm_up
from pools.kubernetes.pods import PodView, endpoint_of, pod_view, routable
from pools.kubernetes.settings import KubernetesDiscoverySettings
from pools.replica import ReplicaState

log = logging.getLogger(__name__)


@dataclass
class DiscoveryStats:
    lists: int = 0  # every list, the first one per pool included
    expired: int = 0  # 410 Gone on a watch → relist
    errors: int = 0  # other API / connection errors (each followed by a backoff)
    added: int = 0
    admitted: int = 0
    removed: int = 0
    moved: int = 0


class KubernetesDiscovery:
    """See the module docstring. `async with KubernetesDiscovery(...):` or start()/stop()."""

    def __init__(
        self,
        settings: KubernetesDiscoverySettings,
        fleet: Fleet,
        tracker: RequestTracker,
        *,
        model: str,
        block_size: int,
        client: httpx.AsyncClient,
        join_check: Callable[[str], bool] = lambda replica_id: True,
        api_factory: Callable[[], KubeApi] | None = None,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 0.1,
    ) -> None:
        self.settings = settings
        self.fleet = fleet
        self.tracker = tracker
        self.model = model
        self.block_size = block_size
        self.client = client
        self.join_check = join_check
        self.api_factory = api_factory or (lambda: KubeApi(settings))
        self.clock = clock
        self.poll_s = poll_s
        self.stats = DiscoveryStats()
        self.pods: dict[str, dict[str, PodView]] = {pool: {} for pool in settings.pools}
        self._synced: set[str] = set()
        self._ours: set[str] = set()  # replica ids this discovery added
        self._admitting: dict[str, asyncio.Task[None]] = {}
        self._removing: dict[str, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._api: KubeApi | None = None

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(warm_up)  # the client's imports would stall routing for seconds
        self._api = self.api_factory()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._run_pool(pool), name=f"k8s-discovery-{pool}")
            for pool in self.settings.pools
        ]

    async def stop(self) -> None:
        pending = [*self._tasks, *self._admitting.values(), *self._removing.values()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._tasks = []
        if self._api is not None:
            await self._api.aclose()
            self._api = None

    async def __aenter__(self) -> KubernetesDiscovery:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def synced(self, pool: str | None = None) -> bool:
        """Has `pool` (every pool) been listed at least once?"""
        return pool in self._synced if pool else self._synced >= set(self.settings.pools)

    def side_channel(self, replica_id: str) -> tuple[str, int] | None:
        from pools.kubernetes.pods import side_channel_of

        for pool, views in self.pods.items():
            if replica_id in views:
                return side_channel_of(views[replica_id], pool, self.settings)
        return None

    # ---- the list/watch loop -----------------------------------------------------------------

    async def _run_pool(self, pool: str) -> None:
        assert self._api is not None
        api = self._api
        selector = self.settings.pool(pool).label_selector
        backoff = self.settings.backoff_initial_s
        version: str | None = None
        while True:
            try:
                if version is None:
                    version, items = await api.list_pods(selector)
                    self.stats.lists += 1
                    self._relisted(pool, items)
                    backoff = self.settings.backoff_initial_s
                async for kind, obj in api.watch_pods(
                    selector, version, self.settings.watch_timeout_s
                ):
                    backoff = self.settings.backoff_initial_s
                    meta = obj.get("metadata") or {}
                    if kind != "BOOKMARK":
                        self._event(pool, kind, obj)
                    version = str(meta.get("resourceVersion") or version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if is_gone(exc):
                    self.stats.expired += 1
                    log.info("discovery %s: watch expired (410), relisting", pool)
                    version = None
                    continue
                self.stats.errors += 1
                log.warning("discovery %s: %r; relisting in %.1fs", pool, exc, backoff)
                version = None  # the server may have restarted without its history
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.backoff_max_s)

    def _relisted(self, pool: str, items: list[dict[str, Any]]) -> None:
        old = self.pods[pool]
        self.pods[pool] = {v.name: v for v in map(pod_view, items)}
        self._synced.add(pool)
        for name in sorted(set(old) | set(self.pods[pool])):
            self._sync(name)

    def _event(self, pool: str, kind: str, obj: dict[str, Any]) -> None:
        view = pod_view(obj)
        if kind == "DELETED":
            self.pods[pool].pop(view.name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self.pods[pool][view.name] = view
        else:
            return
        self._sync(view.name)

    # ---- reconciling one pod -----------------------------------------------------------------

    def _wanted(self, name: str) -> str | None:
        """The pool pod `name` is routable in, else None. Relabelled from one pool to another,
        a pod shows in both until the old pool's watch says DELETED: its newest version (the
        highest resourceVersion) is the truth."""
        seen = [(pool, views[name]) for pool, views in self.pods.items() if name in views]
        if not seen:
            return None
        pool, view = max(seen, key=lambda pv: _version(pv[1]))
        return pool if routable(view) else None

    def _sync(self, name: str) -> None:
        wanted = self._wanted(name)
        replica = self.fleet.get(name)
        if replica is None:
            if wanted is not None and name not in self._removing:
                self._add(name, wanted)
            return
        if name not in self._ours:
            return
        if wanted == replica.pool:
            removing = self._removing.pop(name, None)
            if removing is not None:  # Ready again before its drain ended
                removing.cancel()
                self.fleet.set_draining(name, self.clock(), draining=False)
            return
        if name not in self._removing:
            self._spawn_remove(name)

    def _add(self, name: str, pool: str) -> None:
        view = self.pods[pool][name]
        endpoint = endpoint_of(
            view, pool, self.settings, model=self.model, block_size=self.block_size
        )
        self.fleet.add_replica(endpoint, self.clock(), pending=True)
        self._ours.add(name)
        self.stats.added += 1
        log.info("discovery: pod %s joins pool %s at %s (pending)", name, pool, endpoint.url)
        task = asyncio.get_running_loop().create_task(self._admit(name))
        self._admitting[name] = task
        task.add_done_callback(lambda _: self._admitting.pop(name, None))

    async def _admit(self, name: str) -> None:
        while True:
            replica = self.fleet.get(name)
            if replica is None or replica.state is not ReplicaState.PENDING:
                return
            if await self._healthy(replica.endpoint.health_endpoint) and self.join_check(name):
                self.fleet.admit(name, self.clock())
                self.stats.admitted += 1
                log.info("discovery: pod %s admitted to routing", name)
                return
            await asyncio.sleep(self.poll_s)

    async def _healthy(self, url: str) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return (await self.client.get(url, timeout=2.0)).status_code == 200
        return False

    def _spawn_remove(self, name: str) -> None:
        task = asyncio.get_running_loop().create_task(self._remove(name))
        self._removing[name] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._removing.get(name) is t:
                del self._removing[name]

        task.add_done_callback(done)

    async def _remove(self, name: str) -> None:
        replica = self.fleet.get(name)
        if replica is None:
            return
        if replica.state is not ReplicaState.PENDING:
            await drain_replica(
                self.fleet,
                name,
                self.tracker,
                self.settings.drain_timeout_s,
                client=self.client,
                clock=self.clock,
                poll_s=self.poll_s,
            )
        replica = self.fleet.get(name)
        if replica is None:
            return
        wanted = self._wanted(name)
        now = self.clock()
        if wanted == replica.pool:
            self.fleet.set_draining(name, now, draining=False)
        elif wanted is not None and replica.endpoint.switchable:
            self.fleet.move_replica(name, wanted, now)
            self.stats.moved += 1
            log.info("discovery: pod %s moved %s → %s", name, replica.pool, wanted)
        else:
            self.fleet.remove_replica(name, now)
            self._ours.discard(name)
            self.stats.removed += 1
            log.info("discovery: pod %s left pool %s", name, replica.pool)
            if wanted is not None:  # relabelled but not role-agnostic: join afresh
                self._removing.pop(name, None)
                self._add(name, wanted)


def _version(view: PodView) -> int:
    """resourceVersion as a number (opaque by contract, an etcd revision in practice)."""
    return int(view.resource_version) if view.resource_version.isdigit() else 0
