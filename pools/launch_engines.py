"""The engine handles `pools.launch` starts and stops: a simulated engine in this process, a
`pdorch engine sim` process, a vLLM process; `make_engine` picks one for a launch spec.

Each handle's `start(deadline_s)` returns the replica's `ReplicaEndpoint` once it serves and
`stop()` ends it (processes: SIGTERM to the process group, SIGKILL after `stop_grace_s`);
`log_tail()` is what `FleetLaunchError` quotes when a start fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypedDict

from pools.hardware import HardwareSpec
from pools.http_client import http_client
from pools.launch_spec import (
    SimLaunchSpec,
    VllmLaunchSpec,
    with_hardware,
)
from pools.ports import free_ports
from pools.replica import ReplicaEndpoint
from pools.roles import EngineRole

log = logging.getLogger(__name__)


class FleetLaunchError(RuntimeError):
    """An engine did not start (crashed, or missed its deadline); the message says which."""


_ROLES: dict[str, EngineRole] = {
    "prefill": EngineRole.PREFILL,
    "decode": EngineRole.DECODE,
    "colocated": EngineRole.BOTH,
}
_LOG_TAIL_LINES = 30


class EngineHandle(Protocol):
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
class EngineBase:
    replica_id: str
    pool: str
    model: str
    block_size: int
    events_endpoint: str | None
    replay_endpoint: str | None
    # the pool's `hardware:` (routing constants on the endpoint), keyword-only: after the
    # subclasses' own fields
    hardware: HardwareSpec | None = field(default=None, kw_only=True)

    def log_tail(self) -> str:
        """The last lines of the engine's log ("": it has none, e.g. in-process)."""
        log_path: Path | None = getattr(self, "log_path", None)
        return _tail(log_path) if log_path is not None else ""

    def served_endpoint(
        self, url: str, num_gpu_blocks: int | None, kind: str, switchable: bool
    ) -> ReplicaEndpoint:
        """The endpoint of this engine once it serves at `url` (its KV events on the
        endpoints it was given, topic = its replica id; routing constants from the pool's
        `hardware`)."""
        tps, kv_cost = with_hardware(self.hardware)
        return ReplicaEndpoint(
            replica_id=self.replica_id,
            pool=self.pool,
            url=url,
            model=self.model,
            block_size=self.block_size,
            kv_events_endpoint=self.events_endpoint,
            kv_events_replay_endpoint=self.replay_endpoint,
            kv_events_topic=self.replica_id if self.events_endpoint else "",
            num_gpu_blocks=num_gpu_blocks,
            launched=True,
            kind=kind,
            switchable=switchable,
            prefill_tokens_per_s=tps,
            decode_s_per_kv_token=kv_cost,
        )


@dataclass
class SimInProcessEngine(EngineBase):
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
        return self.served_endpoint(url, server.engine.num_blocks, "sim", self.spec.switchable)

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


def sim_cli_args(
    spec: SimLaunchSpec,
    *,
    role: EngineRole,
    served_model_name: str,
    block_size: int,
    kv_events_endpoint: str | None = None,
    kv_events_replay_endpoint: str | None = None,
    kv_events_topic: str = "kv-events",
    engine_id: str | None = None,
) -> list[str]:
    """`pdorch engine sim` flags for `spec` plus run-time values (port 0: the OS picks); the
    run-time values are `SimLaunchSpec.settings`'s.

    `kv_events_buffer_steps` and `kv_load_failure_policy` have no flag; the CLI uses their
    defaults (10,000 steps, `fail`).
    """
    settings = spec.settings(
        role=role,
        served_model_name=served_model_name,
        block_size=block_size,
        kv_events_endpoint=kv_events_endpoint,
        kv_events_replay_endpoint=kv_events_replay_endpoint,
        kv_events_topic=kv_events_topic,
        engine_id=engine_id,
    )
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
class SimProcessEngine(EngineBase):
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
        return self.served_endpoint(url, num_blocks, "sim", self.spec.switchable)

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
            signal_group(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), self.stop_grace_s)
            except TimeoutError:
                signal_group(process.pid, signal.SIGKILL)
                await process.wait()
        signal_group(process.pid, signal.SIGKILL)


@dataclass
class VllmEngine(EngineBase):
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
        return self.served_endpoint(
            running.url, running.num_gpu_blocks, "vllm", self.spec.switchable
        )

    async def stop(self) -> None:
        from pools.vllm_process import RunningVllm

        running, self._running = self._running, None
        if isinstance(running, RunningVllm):
            await running.stop_async(self.stop_grace_s)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def machine_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return list(range(os.cpu_count() or 1))


class _EngineFields(TypedDict):
    """`EngineBase`'s fields, the same for every kind of engine `make_engine` builds."""

    replica_id: str
    pool: str
    model: str
    block_size: int
    events_endpoint: str | None
    replay_endpoint: str | None


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
    hardware: HardwareSpec | None = None,
) -> EngineHandle:
    """One (not yet started) engine handle: its own ipc:// KV event endpoints (named by the
    replica id, so ids must be unique), its log file; ports are picked when it starts."""
    events = f"ipc://{ipc_dir}/{replica_id}.ev" if spec.kv_events else None
    replay = f"ipc://{ipc_dir}/{replica_id}.rp" if spec.kv_events else None
    base: _EngineFields = {
        "replica_id": replica_id,
        "pool": pool,
        "model": model,
        "block_size": block_size,
        "events_endpoint": events,
        "replay_endpoint": replay,
    }
    if isinstance(spec, SimLaunchSpec) and spec.in_process:
        return SimInProcessEngine(**base, spec=spec, hardware=hardware)
    if isinstance(spec, SimLaunchSpec):
        return SimProcessEngine(
            **base,
            spec=spec,
            hardware=hardware,
            log_path=log_dir / f"{replica_id}.log",
            stop_grace_s=stop_grace_s,
        )
    return VllmEngine(
        **base,
        spec=spec,
        hardware=hardware,
        log_path=log_dir / f"{replica_id}.log",
        cpu_cores=cpu_cores,
        stop_grace_s=stop_grace_s,
    )
