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
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pools.fleet import Fleet, HealthPolicy
from pools.http_client import http_client
from pools.launch_spec import (
    LaunchSettings,
    PoolMembers,
    SimLaunchSpec,
    VllmLaunchSpec,
    replica_ids,
)
from pools.ports import free_ports
from pools.replica import ReplicaEndpoint
from pools.roles import EngineRole

log = logging.getLogger(__name__)

_ROLES: dict[str, EngineRole] = {
    "prefill": EngineRole.PREFILL,
    "decode": EngineRole.DECODE,
    "colocated": EngineRole.BOTH,
}
_LOG_TAIL_LINES = 30


class FleetLaunchError(RuntimeError):
    """An engine did not start (crashed, or missed its deadline); the message says which."""


class FleetLaunchConfig(Protocol):
    """What `launch_fleet` reads (`pdorch.config.fleet.FleetConfig` is one)."""

    @property
    def served_model_name(self) -> str: ...

    @property
    def block_size(self) -> int: ...

    @property
    def launch(self) -> LaunchSettings: ...

    def pool_members(self) -> Mapping[str, PoolMembers]: ...


class _Engine(Protocol):
    replica_id: str
    pool: str

    async def start(self, deadline_s: float) -> ReplicaEndpoint: ...

    async def stop(self) -> None: ...

    def log_tail(self) -> str: ...


def _role_of(pool: str, spec: SimLaunchSpec | VllmLaunchSpec) -> EngineRole:
    """The pool's role, or `both` for a switchable spec (it may serve either pool)."""
    return EngineRole.BOTH if spec.switchable else _ROLES[pool]


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except FileNotFoundError:
        return ""


@dataclass
class _EngineBase:
    replica_id: str
    pool: str
    model: str
    block_size: int
    events_endpoint: str | None
    replay_endpoint: str | None

    def log_tail(self) -> str:
        """The last lines of the engine's log ("": it has none, e.g. in-process)."""
        log_path: Path | None = getattr(self, "log_path", None)
        return _tail(log_path) if log_path is not None else ""


@dataclass
class _SimInProcess(_EngineBase):
    spec: SimLaunchSpec
    _server: object | None = None

    async def start(self, deadline_s: float) -> ReplicaEndpoint:
        from pools.sim.server import SimServer

        settings = self.spec.settings(
            role=_role_of(self.pool, self.spec),
            served_model_name=self.model,
            block_size=self.block_size,
            kv_events_endpoint=self.events_endpoint,
            kv_events_replay_endpoint=self.replay_endpoint,
            kv_events_topic=self.replica_id,
        )
        server = SimServer(settings)
        self._server = server
        try:
            url = await asyncio.wait_for(server.start(), deadline_s)
        except TimeoutError:
            raise FleetLaunchError(
                f"simulated engine {self.replica_id} not serving within {deadline_s:.0f}s"
            ) from None
        return ReplicaEndpoint(
            replica_id=self.replica_id,
            pool=self.pool,
            url=url,
            model=self.model,
            block_size=self.block_size,
            kv_events_endpoint=self.events_endpoint,
            kv_events_replay_endpoint=self.replay_endpoint,
            kv_events_topic=self.replica_id if self.events_endpoint else "",
            num_gpu_blocks=server.engine.num_blocks,
            launched=True,
            kind="sim",
            switchable=self.spec.switchable,
        )

    async def stop(self) -> None:
        from pools.sim.server import SimServer

        server, self._server = self._server, None
        if isinstance(server, SimServer):
            await server.stop()


SIM_FLAG_OF_FIELD = {
    "kv_memory_gb": "--kv-memory-gib",  # the flag names its unit (the value is GiB)
    "kv_host": "--side-channel-host",  # the names `pdorch engine vllm` uses
    "kv_port": "--side-channel-port",
}
"""`SimEngineSettings` fields whose `pdorch engine sim` flag is not `--field-name`."""


def sim_cli_args(spec: SimLaunchSpec, **runtime: object) -> list[str]:
    """`pdorch engine sim` flags for `spec` plus run-time values (port 0: the OS picks).

    `kv_events_buffer_steps` and `kv_load_failure_policy` have no flag; the CLI uses their
    defaults (10,000 steps, `fail`).
    """
    settings = spec.settings(**runtime)  # type: ignore[arg-type]
    skip = {"kv_events_buffer_steps", "kv_load_failure_policy"}
    args: list[str] = []
    for name, value in settings.model_dump().items():
        if name in skip or value is None:
            continue
        flag = SIM_FLAG_OF_FIELD.get(name, "--" + name.replace("_", "-"))
        if isinstance(value, bool):
            args.append(flag if value else f"--no-{name.replace('_', '-')}")
        elif isinstance(value, list | tuple):  # a repeatable flag, one value each
            for item in value:
                args += [flag, str(item)]
        else:
            args += [flag, str(value)]
    return args


@dataclass
class _SimProcess(_EngineBase):
    spec: SimLaunchSpec
    log_path: Path
    stop_grace_s: float
    _process: asyncio.subprocess.Process | None = None

    async def start(self, deadline_s: float) -> ReplicaEndpoint:
        args = sim_cli_args(
            self.spec,
            role=_role_of(self.pool, self.spec),
            served_model_name=self.model,
            block_size=self.block_size,
            kv_events_endpoint=self.events_endpoint,
            kv_events_replay_endpoint=self.replay_endpoint,
            kv_events_topic=self.replica_id,
        )
        argv = [sys.executable, "-c", "from pdorch.cli import main; main()", "engine", "sim"]
        argv += args
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log_file:
            log_file.write(f"$ {' '.join(argv)}\n".encode())
            log_file.flush()
            self._process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
                start_new_session=True,
            )
        assert self._process.stdout is not None
        try:
            line = await asyncio.wait_for(self._process.stdout.readline(), deadline_s)
        except TimeoutError:
            raise self._failure(f"printed no ready line within {deadline_s:.0f}s") from None
        text = line.decode(errors="replace").strip()
        if not text.startswith("ready "):
            await self._process.wait()
            raise self._failure(f"exited with status {self._process.returncode}")
        url = text.removeprefix("ready ").strip()
        num_blocks = await self._num_blocks(url)
        return ReplicaEndpoint(
            replica_id=self.replica_id,
            pool=self.pool,
            url=url,
            model=self.model,
            block_size=self.block_size,
            kv_events_endpoint=self.events_endpoint,
            kv_events_replay_endpoint=self.replay_endpoint,
            kv_events_topic=self.replica_id if self.events_endpoint else "",
            num_gpu_blocks=num_blocks,
            launched=True,
            kind="sim",
            switchable=self.spec.switchable,
        )

    @staticmethod
    async def _num_blocks(url: str) -> int | None:
        import httpx

        with contextlib.suppress(httpx.HTTPError, ValueError):
            async with http_client() as client:
                info = (await client.get(f"{url}/sim/info", timeout=5.0)).json()
                value = info.get("num_gpu_blocks") if isinstance(info, dict) else None
                return int(value) if isinstance(value, int) else None
        return None

    def _failure(self, what: str) -> FleetLaunchError:
        return FleetLaunchError(
            f"simulated engine {self.replica_id} {what} (log: {self.log_path}):\n"
            f"{_tail(self.log_path)}"
        )

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.returncode is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), self.stop_grace_s)
            except TimeoutError:
                _signal_group(process.pid, signal.SIGKILL)
                await process.wait()
        _signal_group(process.pid, signal.SIGKILL)


@dataclass
class _Vllm(_EngineBase):
    spec: VllmLaunchSpec
    log_path: Path
    cpu_cores: str | None
    stop_grace_s: float
    _running: object | None = None

    async def start(self, deadline_s: float) -> ReplicaEndpoint:
        from pools.vllm_process import RunningVllm, VllmEngineError

        port, side_channel_port = free_ports(2)
        engine_spec = self.spec.engine_spec(
            role=_role_of(self.pool, self.spec),
            port=port,
            side_channel_port=side_channel_port,
            served_model_name=self.model,
            block_size=self.block_size,
            kv_events_endpoint=self.events_endpoint,
            kv_events_replay_endpoint=self.replay_endpoint,
            kv_events_topic=self.replica_id,
            cpu_cores=self.cpu_cores,
        )
        running = RunningVllm(engine_spec, self.log_path)
        self._running = running
        running.start()
        try:
            await running.wait_healthy_async(deadline_s)
        except VllmEngineError as err:
            raise FleetLaunchError(f"vLLM engine {self.replica_id}: {err}") from None
        return ReplicaEndpoint(
            replica_id=self.replica_id,
            pool=self.pool,
            url=running.url,
            model=self.model,
            block_size=self.block_size,
            kv_events_endpoint=self.events_endpoint,
            kv_events_replay_endpoint=self.replay_endpoint,
            kv_events_topic=self.replica_id if self.events_endpoint else "",
            num_gpu_blocks=running.num_gpu_blocks,
            launched=True,
            kind="vllm",
            switchable=self.spec.switchable,
        )

    async def stop(self) -> None:
        from pools.vllm_process import RunningVllm

        running, self._running = self._running, None
        if isinstance(running, RunningVllm):
            await running.stop_async(self.stop_grace_s)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _machine_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return list(range(os.cpu_count() or 1))


@dataclass
class RunningFleet:
    """The fleet's replicas once every launched engine serves."""

    endpoints: list[ReplicaEndpoint]
    log_dir: Path
    ipc_dir: Path
    _engines: list[_Engine] = field(default_factory=list, repr=False)
    # pool → the launch spec new replicas of that pool copy (its first one), and fleet facts
    templates: dict[str, SimLaunchSpec | VllmLaunchSpec] = field(default_factory=dict)
    model: str = ""
    block_size: int = 16
    stop_grace_s: float = 20.0
    start_timeout_s: float = 600.0

    def new_engine(self, pool: str, replica_id: str) -> _Engine:
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

    def engine(self, replica_id: str) -> _Engine | None:
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
        if isinstance(engine, _SimProcess):
            return engine.pid
        if isinstance(engine, _Vllm):
            from pools.vllm_process import RunningVllm

            return engine._running.pid if isinstance(engine._running, RunningVllm) else None
        return None

    def pids(self) -> list[int]:
        """Process ids of engines run as processes (tests check they are gone after exit)."""
        pids = []
        for engine in self._engines:
            if isinstance(engine, _SimProcess) and engine.pid is not None:
                pids.append(engine.pid)
            elif isinstance(engine, _Vllm):
                from pools.vllm_process import RunningVllm

                if isinstance(engine._running, RunningVllm) and engine._running.pid is not None:
                    pids.append(engine._running.pid)
        return pids


def make_engine(
    spec: SimLaunchSpec | VllmLaunchSpec,
    *,
    replica_id: str,
    pool: str,
    model: str,
    block_size: int,
    ipc_dir: Path,
    log_dir: Path,
    stop_grace_s: float,
    cpu_cores: str | None = None,
) -> _Engine:
    """One (not yet started) engine handle: its own ipc:// KV event endpoints (named by the
    replica id, so ids must be unique), its log file; ports are picked when it starts."""
    events = f"ipc://{ipc_dir}/{replica_id}.ev" if spec.kv_events else None
    replay = f"ipc://{ipc_dir}/{replica_id}.rp" if spec.kv_events else None
    base = {
        "replica_id": replica_id,
        "pool": pool,
        "model": model,
        "block_size": block_size,
        "events_endpoint": events,
        "replay_endpoint": replay,
    }
    if isinstance(spec, SimLaunchSpec) and spec.in_process:
        return _SimInProcess(**base, spec=spec)  # type: ignore[arg-type]
    if isinstance(spec, SimLaunchSpec):
        return _SimProcess(
            **base,  # type: ignore[arg-type]
            spec=spec,
            log_path=log_dir / f"{replica_id}.log",
            stop_grace_s=stop_grace_s,
        )
    return _Vllm(
        **base,  # type: ignore[arg-type]
        spec=spec,
        log_path=log_dir / f"{replica_id}.log",
        cpu_cores=cpu_cores,
        stop_grace_s=stop_grace_s,
    )


def plan_fleet(
    config: FleetLaunchConfig, ipc_dir: Path, log_dir: Path
) -> tuple[list[ReplicaEndpoint | _Engine], list[str]]:
    """Static endpoints and (not yet started) engine handles in fleet order, plus the ids.

    Pure apart from reading this process's CPU affinity: vLLM engines without `cpu_cores` get
    one core each, round-robin over `os.sched_getaffinity(0)` in fleet order.
    """
    settings = config.launch
    cores = _machine_cores()
    next_core = 0
    plan: list[ReplicaEndpoint | _Engine] = []
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
            )
            plan.append(engine)
            order.append(replica_id)
    return plan, order


async def _stop_all(engines: list[_Engine]) -> None:
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

        async def start(engine: _Engine) -> ReplicaEndpoint:
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
