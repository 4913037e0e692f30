"""`LocalActuator`: replicas as local processes, started and stopped through `pools.launch`.

It scales the pools of a fleet that `pools.launch.launch_fleet` started (`RunningFleet`): a new
replica is a copy of its pool's first launch spec (simulated engine in or out of process, or
real vLLM), with its own replica id (`<pool>-<n>`, never reused), its own ipc:// KV event and
replay endpoints (named by the id), its HTTP port and KV side-channel (NIXL) port picked when
it starts (port 0 / `pools.ports.free_ports`), its own log file.

Lifecycle of a replica it starts:

    pending (starting) → pending (in the fleet, `ReplicaState.PENDING`, not routable)
      → ready (`Fleet.admit`: `/health` answered 200 *and* `join_check(replica_id)`, the
        coordinator following its KV events, said yes)

and of one it removes (`scale` below the provisioned count, least-loaded replica first):

    draining (`pools.drain.drain_replica`: out of routing at once, in-flight requests and
      prefill KV leases finish, bounded by the pool's `drain_timeout_s`) → process stopped,
      replica removed from the fleet

A role switch (`switch_role`, only `switchable` replicas: sim role `both`, vLLM `kv_both`)
drains the same way and then re-labels the replica into the other pool
(`Fleet.move_replica`); the process keeps running.

`scale`/`switch_role` are synchronous (the `Actuator` interface, shared with the simulator's
virtual-time actuator): they check the request (pool known, count within `min`/`max` and the
GPU budget, else `ActuatorError`), then start background tasks on the running event loop;
`current()` shows their progress as pending/draining. `idle()` awaits them (tests, `--once`).
`now` is accepted for the interface; live work runs on `clock` (monotonic).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field

import httpx

from autoscale.actuators.background import BackgroundWork
from autoscale.actuators.base import Actuator, ActuatorError, PoolKey, check_count, pool_key
from autoscale.actuators.recall import DrainingReplica, plan_scale_up
from autoscale.policy import PoolLimits, SloPolicy
from autoscale.signals import Pool, PoolStatus
from pools.drain import DrainOutcome, RequestTracker, drain_replica
from pools.fleet import Fleet
from pools.http_client import http_client
from pools.launch import RunningFleet
from pools.replica import Replica, ReplicaState

log = logging.getLogger(__name__)


class UnknownPoolError(ActuatorError):
    """The pool is not one this actuator manages."""


@dataclass(frozen=True)
class StartFailure:
    """One replica that did not become ready: why, and the tail of its engine's log."""

    pool: str
    replica_id: str
    after_s: float  # from the start of its bring-up
    reason: str
    log_tail: str

    def describe(self) -> str:
        """A multi-line account for an error message or a log line."""
        text = f"{self.replica_id} ({self.pool}) failed after {self.after_s:.0f}s: {self.reason}"
        if self.log_tail and self.log_tail not in self.reason:
            text += f"\nlast lines of its log:\n{self.log_tail}"
        return text


@dataclass
class ActuatorStats:
    """What the actuator did (the coordinator's metrics read it)."""

    started: Counter[str] = field(default_factory=Counter)  # pool → replicas that became ready
    failed_starts: Counter[str] = field(default_factory=Counter)
    failures: list[StartFailure] = field(default_factory=list)  # each failed start, in order
    stopped: Counter[str] = field(default_factory=Counter)
    role_switches: Counter[tuple[str, str]] = field(default_factory=Counter)  # (from, to)
    recalls: Counter[str] = field(default_factory=Counter)  # pool → draining replicas taken back
    drain_moves: Counter[tuple[str, str]] = field(default_factory=Counter)  # draining, moved
    drains: list[tuple[str, DrainOutcome]] = field(default_factory=list)  # (pool, outcome)
    ready_s: list[tuple[str, float]] = field(default_factory=list)  # (pool, start → ready)


class LocalActuator(Actuator):
    """See the module docstring."""

    def __init__(
        self,
        fleet: Fleet,
        running: RunningFleet,
        tracker: RequestTracker,
        *,
        policy: SloPolicy | None = None,
        join_check: Callable[[str], bool] = lambda replica_id: True,
        on_start: Callable[[str], None] = lambda replica_id: None,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 0.05,
        recall: bool = True,
        drain_moves: bool = True,
    ) -> None:
        self.fleet = fleet
        self.running = running
        self.tracker = tracker
        self.policy = policy
        self.join_check = join_check
        # called as a replica's bring-up begins (the live bench times its emulated cold start
        # from here)
        self.on_start = on_start
        self.clock = clock
        self.poll_s = poll_s
        # the scale-up order (`autoscale.actuators.recall`): take back draining replicas
        # before a cold start; `drain_moves` only with the policy's role switching on
        self.recall = recall
        self.drain_moves = drain_moves
        self._own_client = client is None
        self.client = client or http_client(timeout=5.0)
        self.stats = ActuatorStats()
        self._starting: dict[str, str] = {}  # replica id → pool, until ready or failed
        self._draining: dict[str, str] = {}  # replica id → pool it leaves (stop or move)
        self._move_to: dict[str, str] = {}  # replica id → the pool a draining one moves to
        # scale-down drains still waiting for work to finish: id → (drain start, deadline)
        self._recallable: dict[str, tuple[float, float]] = {}
        self._drain_tasks: dict[str, asyncio.Task[None]] = {}
        self._work = BackgroundWork()
        self._start_tasks: dict[str, asyncio.Task[None]] = {}
        self._next: dict[str, int] = {}

    # ---- reading -----------------------------------------------------------------------------

    def pools(self) -> list[str]:
        """Pools this actuator manages: every pool that launches engines or has replicas."""
        return sorted(set(self.running.templates) | set(self.fleet.pools()))

    def limits(self, pool: str) -> PoolLimits:
        if self.policy is not None and pool in (Pool.PREFILL.value, Pool.DECODE.value):
            return self.policy.limits(Pool(pool))
        return PoolLimits()

    def current(self) -> dict[PoolKey, PoolStatus]:
        """Per pool: ready (in the fleet, healthy or not, not draining), pending (starting, or
        moving in from the other pool: as the simulator counts a move), draining (leaving).
        Keys are pool names (`Pool` for prefill/decode)."""
        out: dict[PoolKey, PoolStatus] = {}
        for pool in self.pools():
            replicas = self.fleet.replicas(pool)
            ready = sum(
                1
                for r in replicas
                if r.state in (ReplicaState.HEALTHY, ReplicaState.UNHEALTHY)
                and r.replica_id not in self._draining
            )
            pending = sum(1 for p in self._starting.values() if p == pool)
            pending += sum(1 for p in self._move_to.values() if p == pool)
            draining = sum(
                1 for r, p in self._draining.items() if p == pool and r not in self._move_to
            )
            out[pool_key(pool)] = PoolStatus(ready=ready, pending=pending, draining=draining)
        return out

    def status(self, pool: str) -> PoolStatus:
        return self.current().get(pool_key(pool), PoolStatus())

    def start_report(self, replica_id: str | None = None) -> str:
        """Every failed start so far, and the current log tail of `replica_id` when this
        fleet launched it: what a caller that timed out waiting for a replica should show."""
        lines = [f"failed starts: {dict(self.stats.failed_starts) or 'none'}"]
        lines += [failure.describe() for failure in self.stats.failures]
        engine = self.running.engine(replica_id) if replica_id is not None else None
        if engine is not None:
            state = "starting" if replica_id in self._starting else "not starting"
            lines.append(f"{replica_id} ({state}), last lines of its log:\n{engine.log_tail()}")
        return "\n".join(lines)

    def switchable(self, pool: Pool | str) -> list[str]:
        return [r.replica_id for r in self._ready(str(pool)) if r.endpoint.switchable]

    def _ready(self, pool: str) -> list[Replica]:
        return [
            r
            for r in self.fleet.replicas(pool)
            if r.state in (ReplicaState.HEALTHY, ReplicaState.UNHEALTHY)
            and r.replica_id not in self._draining
        ]

    # ---- checks ------------------------------------------------------------------------------

    def check(self, pool: str, replicas: int) -> None:
        """ActuatorError unless `pool` may have `replicas` (known pool, min/max, GPU budget)."""
        if pool not in self.pools():
            raise UnknownPoolError(f"unknown pool {pool!r}; pools: {', '.join(self.pools())}")
        check_count(
            pool,
            replicas,
            limits_of=self.limits,
            provisioned_of=lambda other: self.status(other).provisioned,
            pools=self.pools(),
            gpu_budget=self.policy.gpu_budget if self.policy is not None else None,
        )
        provisioned = self.status(pool).provisioned
        if replicas > provisioned and pool not in self.running.templates:
            raise ActuatorError(f"pool {pool!r} has no launch spec to start replicas from")

    # ---- acting ------------------------------------------------------------------------------

    def scale(self, pool: Pool | str, replicas: int, now: float) -> None:
        """Start or drain replicas until `pool` has `replicas` provisioned (see module doc)."""
        del now
        pool = str(pool)
        self.check(pool, replicas)
        provisioned = self.status(pool).provisioned
        if replicas > provisioned:
            self._scale_up(pool, replicas - provisioned)
            return
        surplus = provisioned - replicas
        # cancel starts first (newest first): they serve nothing yet
        for replica_id in sorted((r for r, p in self._starting.items() if p == pool), reverse=True)[
            :surplus
        ]:
            self._start_tasks[replica_id].cancel()
            self._starting.pop(replica_id, None)
            surplus -= 1
        # then drain the least-loaded ready replicas (ties: newest, then highest id)
        ready = sorted(self._ready(pool), key=lambda r: r.replica_id, reverse=True)
        ready.sort(key=lambda r: (self.tracker.in_flight(r.replica_id), -r.added_at))  # stable
        for replica in ready[:surplus]:
            self._drain(pool, replica.replica_id, move_to=None)

    def _scale_up(self, pool: str, want: int) -> None:
        """Recall, move a draining replica, then cold-start (`autoscale.actuators.recall`)."""
        limits = self.limits(pool)
        switching = self.policy is not None and self.policy.role_switching
        plan = plan_scale_up(
            pool,
            want,
            self.draining_replicas(),
            recall=self.recall,
            drain_moves=switching and self.drain_moves,
            startup_s=limits.startup_s,
            switch_s=self.policy.switch_s if self.policy is not None else 0.0,
        )
        for replica_id in plan.recall:
            self._take_back(pool, replica_id)
        for replica_id in plan.move:
            self._recallable.pop(replica_id, None)  # it leaves for `pool`: no recall, no stop
            self._move_to[replica_id] = pool
            self.stats.drain_moves[(self._draining[replica_id], pool)] += 1
            log.info("draining replica %s will move to %s", replica_id, pool)
        for _ in range(plan.cold_starts):
            self._start(pool)

    def draining_replicas(self) -> list[DrainingReplica]:
        """The replicas draining for a scale-down, as the scale-up order reads them: work =
        in-flight requests, remaining = the time left before the drain's deadline (the
        coordinator does not see outputs left; the drain cannot last longer)."""
        now = self.clock()
        return [
            DrainingReplica(
                replica_id,
                self._draining[replica_id],
                float(self.tracker.in_flight(replica_id)),
                since,
                max(0.0, deadline - now),
                movable=replica.endpoint.switchable,
            )
            for replica_id, (since, deadline) in self._recallable.items()
            if (replica := self.fleet.get(replica_id)) is not None
        ]

    def _take_back(self, pool: str, replica_id: str) -> None:
        """Cancel a scale-down drain: the replica serves again at once, its in-flight requests
        (never cut: the drain had not reached its deadline) go on."""
        task = self._drain_tasks.pop(replica_id, None)
        if task is not None:
            task.cancel()
        self._recallable.pop(replica_id, None)
        self._draining.pop(replica_id, None)
        self.fleet.set_draining(replica_id, self.clock(), draining=False)  # routable now
        self.stats.recalls[pool] += 1
        log.info("replica %s (%s) recalled from its drain", replica_id, pool)

    def switch_role(self, replica_id: str, to_pool: Pool | str, now: float) -> None:
        """Drain `replica_id`'s current-role work, then re-label it into `to_pool`."""
        del now
        to_pool = str(to_pool)
        replica = self.fleet.get(replica_id)
        if replica is None:
            raise ActuatorError(f"unknown replica {replica_id!r}")
        if to_pool not in self.pools():
            raise UnknownPoolError(f"unknown pool {to_pool!r}; pools: {', '.join(self.pools())}")
        if replica.pool == to_pool:
            raise ActuatorError(f"replica {replica_id!r} is already in pool {to_pool!r}")
        if not replica.endpoint.switchable:
            raise ActuatorError(
                f"replica {replica_id!r} cannot switch role: it was not launched role-agnostic "
                "(launch spec `switchable: true`: sim role both, vLLM kv_both)"
            )
        if replica_id in self._draining or replica not in self._ready(replica.pool):
            raise ActuatorError(f"replica {replica_id!r} is not ready (state {replica.state})")
        from_limits = self.limits(replica.pool)
        left = self.status(replica.pool).provisioned - 1
        if left < from_limits.min:
            raise ActuatorError(
                f"pool {replica.pool!r}: moving {replica_id!r} out leaves {left} replicas, "
                f"below its min of {from_limits.min}"
            )
        to_limits = self.limits(to_pool)
        if self.status(to_pool).provisioned + 1 > to_limits.max:
            raise ActuatorError(
                f"pool {to_pool!r}: moving {replica_id!r} in would exceed its max of "
                f"{to_limits.max}"
            )
        self._drain(replica.pool, replica_id, move_to=to_pool)

    async def idle(self, timeout_s: float = 600.0) -> None:
        """Wait until every start, drain and move has finished."""
        await self._work.idle(timeout_s)

    async def aclose(self) -> None:
        """Cancel what is still running (the fleet's `launch_fleet` stops the engines)."""
        await self._work.cancel()
        if self._own_client:
            await self.client.aclose()

    # ---- background work ---------------------------------------------------------------------

    def _spawn(
        self, coro: Coroutine[object, object, None], replica_id: str | None = None
    ) -> asyncio.Task[None]:
        task = self._work.spawn(coro)
        if replica_id is not None:
            self._start_tasks[replica_id] = task
            task.add_done_callback(lambda _: self._start_tasks.pop(replica_id, None))
        return task

    def _new_id(self, pool: str) -> str:
        n = self._next.get(pool, len(self.fleet.replicas(pool)))
        while (
            f"{pool}-{n}" in self.fleet
            or f"{pool}-{n}" in self._starting
            or self.running.engine(f"{pool}-{n}") is not None
        ):
            n += 1
        self._next[pool] = n + 1
        return f"{pool}-{n}"

    def _start(self, pool: str) -> str:
        replica_id = self._new_id(pool)
        self._starting[replica_id] = pool
        self._spawn(self._bring_up(pool, replica_id), replica_id)
        return replica_id

    async def _bring_up(self, pool: str, replica_id: str) -> None:
        started = self.clock()
        self.on_start(replica_id)
        engine = self.running.new_engine(pool, replica_id)
        added = False
        try:
            spec_timeout = getattr(getattr(engine, "spec", None), "start_timeout_s", None)
            deadline_s = spec_timeout or self.running.start_timeout_s
            endpoint = await engine.start(deadline_s)
            self.fleet.add_replica(endpoint, self.clock(), pending=True)
            added = True
            deadline = started + deadline_s
            while not (
                await self._healthy(endpoint.health_endpoint) and self.join_check(replica_id)
            ):
                if self.clock() >= deadline:
                    raise TimeoutError(f"{replica_id} not ready within {deadline_s:g}s")
                await asyncio.sleep(self.poll_s)
            if self._starting.get(replica_id) != pool:  # cancelled meanwhile
                raise asyncio.CancelledError
            self.fleet.admit(replica_id, self.clock())
            self.stats.started[pool] += 1
            self.stats.ready_s.append((pool, self.clock() - started))
            log.info("replica %s (%s) ready in %.2fs", replica_id, pool, self.clock() - started)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                failure = StartFailure(
                    pool, replica_id, self.clock() - started, str(exc), engine.log_tail()
                )
                self.stats.failed_starts[pool] += 1
                self.stats.failures.append(failure)
                log.warning("replica %s did not start: %s", replica_id, failure.describe())
            if added and replica_id in self.fleet:
                self.fleet.remove_replica(replica_id, self.clock())
            await asyncio.shield(engine.stop())
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._starting.pop(replica_id, None)

    async def _healthy(self, url: str) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return (await self.client.get(url, timeout=2.0)).status_code == 200
        return False

    def _drain(self, pool: str, replica_id: str, move_to: str | None) -> None:
        now = self.clock()
        self._draining[replica_id] = pool
        if move_to is not None:
            self._move_to[replica_id] = move_to
        else:  # a scale-down drain: a scale-up may take it back until its work is done
            self._recallable[replica_id] = (now, now + self.limits(pool).drain_timeout_s)
        self.fleet.set_draining(replica_id, now)  # out of routing now, not next tick
        task = self._spawn(self._drain_then(pool, replica_id))
        self._drain_tasks[replica_id] = task

    async def _drain_then(self, pool: str, replica_id: str) -> None:
        me = asyncio.current_task()
        try:
            outcome = await drain_replica(
                self.fleet,
                replica_id,
                self.tracker,
                self.limits(pool).drain_timeout_s,
                client=self.client,
                clock=self.clock,
                poll_s=self.poll_s,
            )
            # from here on it leaves (or moves): no recall; nothing awaited since the drain
            # returned, so a scale-up cannot have taken it back in between
            self._recallable.pop(replica_id, None)
            self.stats.drains.append((pool, outcome))
            move_to = self._move_to.get(replica_id)
            if move_to is not None:
                self.fleet.move_replica(replica_id, move_to, self.clock())
                self.stats.role_switches[(pool, move_to)] += 1
                log.info("replica %s moved %s → %s", replica_id, pool, move_to)
                return
            if replica_id in self.fleet:
                self.fleet.remove_replica(replica_id, self.clock())
            engine = self.running.engine(replica_id)
            if engine is not None:
                await asyncio.shield(engine.stop())
            self.stats.stopped[pool] += 1
            log.info("replica %s (%s) drained in %.2fs", replica_id, pool, outcome.duration_s)
        finally:
            # a recalled drain's bookkeeping was cleared by the recall (and may belong to a
            # later drain of the same replica by now): only this drain's own is removed
            if self._drain_tasks.get(replica_id) is me:
                del self._drain_tasks[replica_id]
                self._draining.pop(replica_id, None)
                self._move_to.pop(replica_id, None)
                self._recallable.pop(replica_id, None)
