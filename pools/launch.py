"""Start the engines a fleet file asks for, wait until they serve, stop them all on exit.

```python
async with launch_fleet(config) as running:      # config: pdorch.config.fleet.FleetConfig
    fleet = running.fleet(time.monotonic())       # every replica, static and launched
    ...
```

- Simulated engines run in this process (`pools.sim.server.SimServer` on the running event
  loop, `port=0` so starts never race for ports) or, with `in_process: false`, as
  `pdorch engine sim --port 0 ...` processes whose `ready <url>` stdout line is awaited.
- vLLM engines run through `pools.vllm_process.RunningVllm` with ports picked at run time and,
  unless the spec pins `cpu_cores`, one CPU core each, round-robin over this process's cores.
- Launched engines publish KV events on `ipc://` sockets in a private temp dir (the engine
  binds, so the coordinator's subscriber connects; the replay socket too), topic = replica id.
- Everything starts concurrently. If one engine fails or misses its deadline, the others are
  stopped and `FleetLaunchError` carries that engine's log tail. Leaving the `async with` for
  any reason (normal exit, error, cancellation on Ctrl-C) stops every engine and removes the
  ipc dir (and the log dir when it was a temp dir and nothing failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pools.fleet import Fleet, HealthPolicy
from pools.launch_engines import (
    EngineHandle,
    SimProcessEngine,
    VllmEngine,
    machine_cores,
    make_engine,
)
from pools.launch_spec import (
    LaunchSettings,
    PoolMembers,
    SimLaunchSpec,
    VllmLaunchSpec,
    replica_ids,
)
from pools.replica import ReplicaEndpoint

log = logging.getLogger(__name__)


class FleetLaunchConfig(Protocol):
    """What `launch_fleet` reads (`pdorch.config.fleet.FleetConfig` is one)."""

    @property
    def served_model_name(self) -> str: ...

    @property
    def block_size(self) -> int: ...

    @property
    def launch(self) -> LaunchSettings: ...

    def pool_members(self) -> Mapping[str, PoolMembers]: ...


@dataclass
class RunningFleet:
    """The fleet's replicas once every launched engine serves."""

    endpoints: list[ReplicaEndpoint]
    log_dir: Path
    ipc_dir: Path
    _engines: list[EngineHandle] = field(default_factory=list, repr=False)
    # pool → the launch spec new replicas of that pool copy (its first one), and fleet facts
    templates: dict[str, SimLaunchSpec | VllmLaunchSpec] = field(default_factory=dict)
    model: str = ""
    block_size: int = 16
    stop_grace_s: float = 20.0
    start_timeout_s: float = 600.0

    def new_engine(self, pool: str, replica_id: str) -> EngineHandle:
        """An engine like the pool's first launch spec (KeyError: the pool launches none).
        It is stopped with the fleet when the `launch_fleet` block ends."""
        spec = self.templates[pool]
        engine = make_engine(
            spec.model_copy(update={"count": 1}),
            replica_id=replica_id,
            pool=pool,
            model=self.model,
            block_size=self.block_size,
            ipc_dir=self.ipc_dir,
            log_dir=self.log_dir,
            stop_grace_s=self.stop_grace_s,
        )
        self._engines.append(engine)
        return engine

    def engine(self, replica_id: str) -> EngineHandle | None:
        """The handle of a replica this fleet launched (None: static, or unknown)."""
        for engine in self._engines:
            if engine.replica_id == replica_id:
                return engine
        return None

    def by_pool(self, pool: str) -> list[ReplicaEndpoint]:
        return [e for e in self.endpoints if e.pool == pool]

    def fleet(self, now: float, policy: HealthPolicy | None = None) -> Fleet:
        """A new `Fleet` holding every endpoint (HEALTHY)."""
        fleet = Fleet(policy)
        for endpoint in self.endpoints:
            fleet.add_replica(endpoint, now)
        return fleet

    def describe(self) -> list[str]:
        """One line per replica: id, pool, kind, URL, KV events (for `pdorch serve`)."""
        lines = []
        for e in self.endpoints:
            events = e.kv_events_endpoint or "no KV events"
            lines.append(f"{e.replica_id:<14} {e.pool:<9} {e.kind:<6} {e.url}  {events}")
        return lines

    def pid_of(self, replica_id: str) -> int | None:
        """Process id of one launched engine run as a process (None: in-process, stopped)."""
        engine = self.engine(replica_id)
        if isinstance(engine, SimProcessEngine):
            return engine.pid
        if isinstance(engine, VllmEngine):
            from pools.vllm_process import RunningVllm

            return engine._running.pid if isinstance(engine._running, RunningVllm) else None
        return None

    def pids(self) -> list[int]:
        """Process ids of engines run as processes (tests check they are gone after exit)."""
        pids = []
        for engine in self._engines:
            if isinstance(engine, SimProcessEngine) and engine.pid is not None:
                pids.append(engine.pid)
            elif isinstance(engine, VllmEngine):
                from pools.vllm_process import RunningVllm

                if isinstance(engine._running, RunningVllm) and engine._running.pid is not None:
                    pids.append(engine._running.pid)
        return pids


def plan_fleet(
    config: FleetLaunchConfig, ipc_dir: Path, log_dir: Path
) -> tuple[list[ReplicaEndpoint | EngineHandle], list[str]]:
    """Static endpoints and (not yet started) engine handles in fleet order, plus the ids.

    Pure apart from reading this process's CPU affinity: vLLM engines without `cpu_cores` get
    one core each, round-robin over `os.sched_getaffinity(0)` in fleet order.
    """
    settings = config.launch
    cores = machine_cores()
    next_core = 0
    plan: list[ReplicaEndpoint | EngineHandle] = []
    order: list[str] = []
    for pool, members in config.pool_members().items():
        ids = replica_ids(pool, members)
        for (replica_id, spec_index), static in zip(
            ids[: len(members.endpoints)], members.endpoints, strict=True
        ):
            del spec_index
            plan.append(
                static.to_endpoint(
                    replica_id=replica_id,
                    pool=pool,
                    model=config.served_model_name,
                    block_size=config.block_size,
                    hardware=members.hardware,
                )
            )
            order.append(replica_id)
        for replica_id, spec_index in ids[len(members.endpoints) :]:
            assert spec_index is not None
            spec = members.launch[spec_index]
            core = None
            if isinstance(spec, VllmLaunchSpec):
                core = str(cores[next_core % len(cores)]) if spec.cpu_cores is None else None
                next_core += 1
            engine = make_engine(
                spec,
                replica_id=replica_id,
                pool=pool,
                model=config.served_model_name,
                block_size=config.block_size,
                ipc_dir=ipc_dir,
                log_dir=log_dir,
                stop_grace_s=settings.stop_grace_s,
                cpu_cores=core,
                hardware=members.hardware,
            )
            plan.append(engine)
            order.append(replica_id)
    return plan, order


async def _stop_all(engines: list[EngineHandle]) -> None:
    results = await asyncio.gather(*(e.stop() for e in engines), return_exceptions=True)
    for engine, result in zip(engines, results, strict=True):
        if isinstance(result, BaseException):
            log.warning("stopping %s failed: %r", engine.replica_id, result)


@contextlib.asynccontextmanager
async def launch_fleet(
    config: FleetLaunchConfig, *, log_dir: Path | None = None
) -> AsyncIterator[RunningFleet]:
    """Start every launch spec's engines, yield the running fleet, stop them on exit."""
    settings = config.launch
    # ipc:// paths must stay short (unix socket paths are capped near 107 bytes)
    ipc_dir = Path(tempfile.mkdtemp(prefix="pdorch-fleet-"))
    own_logs = log_dir is None and settings.log_dir is None
    logs = log_dir or settings.log_dir or Path(tempfile.mkdtemp(prefix="pdorch-fleet-logs-"))
    keep_logs = False
    plan, _ = plan_fleet(config, ipc_dir, logs)
    engines = [p for p in plan if not isinstance(p, ReplicaEndpoint)]
    try:
        started = time.monotonic()

        async def start(engine: EngineHandle) -> ReplicaEndpoint:
            spec_timeout = getattr(getattr(engine, "spec", None), "start_timeout_s", None)
            timeout = spec_timeout or settings.start_timeout_s
            return await engine.start(max(0.1, timeout - (time.monotonic() - started)))

        tasks = [asyncio.ensure_future(start(e)) for e in engines]
        try:
            # the first failure cancels the other starts at once instead of waiting out theirs
            done = await asyncio.gather(*tasks)
        except BaseException:
            keep_logs = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        launched = iter(done)
        endpoints = [p if isinstance(p, ReplicaEndpoint) else next(launched) for p in plan]
        templates = {
            pool: members.launch[0]
            for pool, members in config.pool_members().items()
            if members.launch
        }
        running = RunningFleet(
            endpoints,
            logs,
            ipc_dir,
            engines,
            templates=templates,
            model=config.served_model_name,
            block_size=config.block_size,
            stop_grace_s=settings.stop_grace_s,
            start_timeout_s=settings.start_timeout_s,
        )
        log.info("fleet up in %.1fs: %d replicas", time.monotonic() - started, len(endpoints))
        yield running
    finally:
        # A second Ctrl-C (another cancellation) must not cut the shutdown short: engine
        # processes run in their own sessions and would outlive us.
        stopping = asyncio.ensure_future(_stop_all(engines))
        cancelled = False
        while not stopping.done():
            try:
                await asyncio.shield(stopping)
            except asyncio.CancelledError:
                cancelled = True
        shutil.rmtree(ipc_dir, ignore_errors=True)
        if own_logs and not keep_logs:
            shutil.rmtree(logs, ignore_errors=True)
        if cancelled:
            raise asyncio.CancelledError
