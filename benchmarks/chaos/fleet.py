"""The fleet a chaos scenario breaks: 2 prefill + 2 decode `pdorch engine sim` processes behind
one `pdorch serve`, every engine on a port fixed at start so it can be restarted on the same one.

Each engine is its own OS process (as in production: `kill -9` takes exactly one engine down),
with its HTTP port, KV-event PUB port and replay ROUTER port chosen once (`free_port`); the
coordinator is `pdorch serve --config` over a fleet file of static endpoints naming them
(`benchmarks.proxy.processes.start_pdorch`). Faults are signals to the engine's pid:
`kill` (SIGKILL), `pause` (SIGSTOP: no reset, no FIN, the socket stays open), `resume`
(SIGCONT), `restart` (SIGTERM, then the same command on the same ports). `close` stops
everything, whatever state the engines are in.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.chaos.relays import DelayProxy, EventRelay
from benchmarks.proxy.processes import (
    ProcessStartError,
    RunningProcess,
    start_pdorch,
    stop_process,
    venv_bin,
)
from pools.ports import free_port, free_ports

ROLES = ("prefill", "prefill", "decode", "decode")


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One engine's fixed identity: replica id, role and ports."""

    replica_id: str
    role: str
    port: int
    kv_events_port: int
    replay_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True, slots=True)
class FleetSettings:
    """The simulated engines' timing and size, and the coordinator's P/D threshold."""

    model_profile: str = "llama-3.1-8b"
    gpu: str = "h100"
    time_scale: float = 1.0
    num_blocks: int = 8192
    served_model_name: str = "chaos-model"
    min_uncached_tokens: int = 32
    start_timeout_s: float = 90.0
    # The coordinator's `stall_timeout_s` (its default is 10 s): a stream silent this long is
    # continued on the other decode replica. The bench counts a client "hung" past 5 s without a
    # byte, so the stall must be caught well inside 5 s: 2.5 s leaves 2.5 s for the continuation
    # (a local prefill of prompt + tokens streamed on the other decode engine, tens of ms idle,
    # seconds on a starved 2-core box) to send its first byte. Lower it and a healthy engine's
    # pause on a loaded box (seen up to 9 s at load average 17) is taken for a hang more often.
    stall_timeout_s: float = 2.5
    # The coordinator's `first_byte_timeout_s` (default 2 x stall_timeout_s = 5 s here, the
    # hung threshold itself): a decode stream with no first byte this long is re-sent to the
    # other decode replica. 2.5 s for the same reason as the stall timeout.
    first_byte_timeout_s: float = 2.5
    # admission (pdorch/app/admission.py): off in the fault scenarios, set by `overload`
    max_concurrent_requests: int | None = None
    max_queue: int = 0
    max_wait_s: float = 5.0
    # head shedding while the coordinator's loop lags (pdorch/app/head_shed.py): None = the
    # coordinator's default (`coordinator.head_shed.max_lag_s`)
    head_shed_max_lag_s: float | None = None
    # ... and its cap on heads waiting for their handler (None: the coordinator's default)
    head_shed_max_pending: int | None = None
    # the coordinator's `listen_backlog` and `max_connections` (None: its defaults;
    # `connect-storm` sets the backlog)
    listen_backlog: int | None = None
    max_connections: int | None = None


@dataclass
class ChaosFleet:
    """Running engines by replica id, and the coordinator over them."""

    settings: FleetSettings
    log_dir: Path
    specs: dict[str, EngineSpec] = field(default_factory=dict)
    engines: dict[str, RunningProcess] = field(default_factory=dict)
    coordinator: RunningProcess | None = None
    restarts: int = 0
    # relays.py, between the coordinator and the engines named at `start`
    proxies: dict[str, DelayProxy] = field(default_factory=dict)
    relays: dict[str, EventRelay] = field(default_factory=dict)
    # `start(coordinators=2)`: every `pdorch serve` (index 0 is `coordinator`), each on a port
    # and a peer-sync PUB port fixed at start (so one can be restarted on the same ones)
    coordinators: list[RunningProcess] = field(default_factory=list)
    coordinator_ports: list[tuple[int, int]] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self.coordinator is not None, "the coordinator is not started"
        return self.coordinator.url

    async def start(
        self, slowed: tuple[str, ...] = (), relayed: tuple[str, ...] = (), coordinators: int = 1
    ) -> None:
        """Engines, then the coordinator; `slowed` engines' HTTP goes through a `DelayProxy`,
        `relayed` engines' KV events through an `EventRelay` (both start passing through).
        `coordinators` > 1: that many `pdorch serve` over the same fleet file, peer sync on
        (its `sync:` section lists every one's PUB endpoint; each binds its own)."""
        counts: dict[str, int] = {}
        # every engine's three ports held together, so none is handed out twice (the vllm
        # fleet's kill -9 decode-0 row once measured two servers on one port)
        ports = iter(free_ports(3 * len(ROLES)))
        for role in ROLES:
            index = counts.get(role, 0)
            counts[role] = index + 1
            spec = EngineSpec(f"{role}-{index}", role, next(ports), next(ports), next(ports))
            self.specs[spec.replica_id] = spec
        for spec in self.specs.values():
            self.engines[spec.replica_id] = await self._start_engine(spec)
        for replica_id in slowed:
            proxy = DelayProxy(self.specs[replica_id].port)
            await proxy.start()
            self.proxies[replica_id] = proxy
        for replica_id in relayed:
            relay = EventRelay(f"tcp://127.0.0.1:{self.specs[replica_id].kv_events_port}")
            await relay.start()
            self.relays[replica_id] = relay
        if coordinators == 1:
            fleet_file = self.log_dir / "fleet.yaml"
            fleet_file.write_text(self.fleet_yaml())
            self.coordinator = await start_pdorch(
                fleet_file, free_port(), self.log_dir, start_timeout_s=self.settings.start_timeout_s
            )
            self.coordinators = [self.coordinator]
            return
        self.coordinator_ports = [(free_port(), free_port()) for _ in range(coordinators)]
        (self.log_dir / "fleet.yaml").write_text(self.fleet_yaml())
        for index in range(coordinators):
            self.coordinators.append(await self._start_coordinator(index))
        self.coordinator = self.coordinators[0]

    def _sync_endpoint(self, index: int) -> str:
        return f"tcp://127.0.0.1:{self.coordinator_ports[index][1]}"

    async def _start_coordinator(self, index: int) -> RunningProcess:
        """Coordinator `index` of several, on its fixed ports; logs in `coordinator-<index>.<n>`
        (n: its starts so far, so a restart does not overwrite the killed one's log)."""
        starts = sum(1 for _ in self.log_dir.glob(f"coordinator-{index}.*"))
        log_dir = self.log_dir / f"coordinator-{index}.{starts}"
        log_dir.mkdir(parents=True, exist_ok=True)
        proc = await start_pdorch(
            self.log_dir / "fleet.yaml",
            self.coordinator_ports[index][0],
            log_dir,
            start_timeout_s=self.settings.start_timeout_s,
            serve_args=["--sync-bind", self._sync_endpoint(index)],
        )
        proc.name = f"coordinator-{index}"
        return proc

    def kill_coordinator(self, index: int) -> None:
        """`kill -9` coordinator `index`: its clients' connections reset, its peer hears nothing
        more (no `bye`) and expires its token-load entries after `peer_timeout_s`."""
        proc = self.coordinators[index]
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.process.wait(10.0)

    async def restart_coordinator(self, index: int) -> None:
        """Start coordinator `index` again on the same HTTP and sync ports (a new process: a new
        origin and incarnation; its KV index starts empty and is rebuilt by replay)."""
        self.coordinators[index] = await self._start_coordinator(index)
        if index == 0:
            self.coordinator = self.coordinators[0]

    def fleet_yaml(self) -> str:
        """The coordinator's fleet file: the engines as static endpoints, default health rules."""
        pools: dict[str, list[str]] = {"prefill": [], "decode": []}
        for spec in self.specs.values():
            proxy = self.proxies.get(spec.replica_id)
            url = spec.url if proxy is None else f"http://127.0.0.1:{proxy.port}"
            relay = self.relays.get(spec.replica_id)
            events_port = spec.kv_events_port if relay is None else relay.port
            pools[spec.role].append(
                f"      - id: {spec.replica_id}\n"
                f"        url: {url}\n"
                f"        kv_events_endpoint: tcp://127.0.0.1:{events_port}\n"
                f"        kv_events_replay_endpoint: tcp://127.0.0.1:{spec.replay_port}\n"
                f"        kv_events_topic: {spec.replica_id}\n"
            )
        s = self.settings
        admission = ""
        if s.max_concurrent_requests is not None:
            admission = (
                f", max_concurrent_requests: {s.max_concurrent_requests}, admission: "
                f"{{max_queue: {s.max_queue}, max_wait_s: {s.max_wait_s}}}"
            )
        head_shed = {
            "max_lag_s": s.head_shed_max_lag_s,
            "max_pending_requests": s.head_shed_max_pending,
        }
        if shed := ", ".join(f"{k}: {v}" for k, v in head_shed.items() if v is not None):
            admission += f", head_shed: {{{shed}}}"
        for key, value in (
            ("listen_backlog", s.listen_backlog),
            ("max_connections", s.max_connections),
        ):
            if value is not None:
                admission += f", {key}: {value}"
        return (
            f"served_model_name: {s.served_model_name}\n"
            "block_size: 16\n"
            "pools:\n"
            "  prefill:\n    endpoints:\n" + "".join(pools["prefill"]) + "  decode:\n"
            "    endpoints:\n" + "".join(pools["decode"]) + "pd: {min_uncached_tokens: "
            f"{s.min_uncached_tokens}}}\n"
            "tokenizer: {mode: engine}\n"
            f"coordinator: {{host: 127.0.0.1, stall_timeout_s: {s.stall_timeout_s}, "
            f"first_byte_timeout_s: {s.first_byte_timeout_s}{admission}}}\n" + self._sync_yaml()
        )

    def _sync_yaml(self) -> str:
        """The `sync:` section when several coordinators run (none for one)."""
        if len(self.coordinator_ports) < 2:
            return ""
        peers = ", ".join(self._sync_endpoint(i) for i in range(len(self.coordinator_ports)))
        return f"sync: {{peers: [{peers}]}}\n"

    def _command(self, spec: EngineSpec) -> list[str]:
        s = self.settings
        return [
            venv_bin("pdorch"),
            "engine",
            "sim",
            "--role",
            spec.role,
            "--port",
            str(spec.port),
            "--time-scale",
            str(s.time_scale),
            "--model-profile",
            s.model_profile,
            "--gpu",
            s.gpu,
            "--served-model-name",
            s.served_model_name,
            "--kv-transport",
            "tcp",
            "--num-blocks",  # a small pool starts in a second (the profile's takes longer)
            str(s.num_blocks),
            # `*`: the engine binds its PUB socket (vLLM's rule: any other tcp endpoint is
            # connected to); the coordinator and the relays connect to 127.0.0.1:port
            "--kv-events-endpoint",
            f"tcp://*:{spec.kv_events_port}",
            "--kv-events-replay-endpoint",
            f"tcp://127.0.0.1:{spec.replay_port}",
            "--kv-events-topic",
            spec.replica_id,
            "--engine-id",
            spec.replica_id,
        ]

    async def _start_engine(self, spec: EngineSpec) -> RunningProcess:
        log_path = self.log_dir / f"{spec.replica_id}.{self.restarts}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(  # noqa: ASYNC220  (start-up, not a timed path)
                self._command(spec), stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL
            )
        assert process.stdout is not None
        proc = RunningProcess(spec.replica_id, spec.url, process, log_path)
        loop = asyncio.get_running_loop()
        try:
            line = await asyncio.wait_for(
                loop.run_in_executor(None, process.stdout.readline), self.settings.start_timeout_s
            )
        except TimeoutError:
            stop_process(proc)
            raise ProcessStartError(f"{spec.replica_id}: no ready line ({log_path})") from None
        if not line.startswith(b"ready "):
            stop_process(proc)
            raise ProcessStartError(f"{spec.replica_id}: {line!r} ({log_path})")
        return proc

    # ---- faults ------------------------------------------------------------------------------

    def signal(self, replica_id: str, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.engines[replica_id].pid, sig)

    def kill(self, replica_id: str) -> None:
        """`kill -9`: the process is gone, its sockets reset, connections are refused."""
        self.signal(replica_id, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.engines[replica_id].process.wait(10.0)

    def pause(self, replica_id: str) -> None:
        """SIGSTOP: a hung engine (connections open, nothing answers)."""
        self.signal(replica_id, signal.SIGSTOP)

    def resume(self, replica_id: str) -> None:
        self.signal(replica_id, signal.SIGCONT)

    async def restart(self, replica_id: str) -> None:
        """Stop the engine if it still runs (SIGTERM), start it again on the same ports."""
        stop_process(self.engines[replica_id], grace_s=5.0)
        self.restarts += 1
        self.engines[replica_id] = await self._start_engine(self.specs[replica_id])

    async def close_relays(self) -> None:
        for proxy in self.proxies.values():
            await proxy.close()
        for relay in self.relays.values():
            await relay.close()

    def close(self) -> None:
        for replica_id in self.engines:
            self.resume(replica_id)  # a stopped process cannot act on SIGTERM
        for coordinator in self.coordinators:
            stop_process(coordinator)
        if self.coordinator is not None and self.coordinator not in self.coordinators:
            stop_process(self.coordinator)
        for proc in self.engines.values():
            stop_process(proc)
