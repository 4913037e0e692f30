"""`pdorch serve --workers N`: N coordinator processes on one port, and their supervisor.

One Python process tops out at one core of proxying; N workers on one host spread the
connections over N cores. The `pdorch serve` process becomes the **supervisor**:

- it launches the fleet's engines once (`pools.launch.launch_fleet`) and reserves the port
  (`reserve_port`: a socket bound with `SO_REUSEPORT` that never listens, so `--port 0` has a
  port to give every worker and a restarted worker finds it free);
- it starts N workers (`python -m pdorch.app.worker_main SPEC`), each a whole coordinator over
  the same engines as *static* endpoints (`worker_fleet_config`), binding its own listening
  socket on that port with `SO_REUSEPORT`: the kernel spreads new connections over the
  listening sockets (a hash of the 4-tuple, so one keep-alive connection stays on one worker);
- the workers share token load over `pdorch.sync.PeerSync`, each a peer of all the others, on
  loopback ZMQ ports the supervisor picks at run time (never configured). Everything else a
  routing decision reads is already per worker and identical: each follows every engine's KV
  events (ZMQ PUB reaches every subscriber), probes health and scrapes engine metrics itself.
  Per worker (not shared): the routing-history KV index (`ApproxKvIndex`, only used for
  engines without KV events), the late-binding queue and the admission queue (the file's
  `max_concurrent_requests` and `admission.max_queue` are split over the workers, rounded up);
- each worker also serves the same app on a private port of its own (picked at run time, kept
  across its restarts): `/metrics`, `/admin/*` of exactly that worker. On the shared port
  `/metrics` is the registry of whichever worker the connection lands on, so Prometheus should
  scrape every worker's private URL as its own target (the `instance` label tells workers
  apart; printed at start, and in `--json` as `workers[].url`). We chose that over
  prometheus-client's multiprocess mode, which needs a shared directory, file-backed values and
  a collector that re-reads every worker's files on each scrape, and changes what gauges mean;
- the fleet is **fixed** while N > 1: scale, move, add/remove a replica and drain answer 409
  `fixed_fleet` on every worker (a change applied by one worker would miss the others), and the
  in-process autoscaler is refused at start (it would need one leader applying its decisions
  fleet-wide: not built). `--workers 1` (the default) is the unchanged single process;
- SIGTERM/SIGINT to the supervisor is forwarded as SIGTERM to every worker: each stops
  accepting, lets open requests finish (2 s, as a single `pdorch serve`), says `bye` to its
  sync peers and exits; then the engines stop. A worker that dies is restarted after
  `RestartBackoff.delay` (logged as a warning with its exit status); a worker that cannot start
  at all makes `pdorch serve` exit 1 with its reason. Workers ask the kernel for SIGTERM if
  the supervisor dies (`PR_SET_PDEATHSIG`), so none outlives it holding the port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdorch.config.fleet import FleetConfig
from pools.ports import free_ports
from pools.replica import ReplicaEndpoint

log = logging.getLogger(__name__)

FIXED_FLEET = (
    "This coordinator is one of {n} workers of `pdorch serve --workers {n}`: the fleet is fixed "
    "while several workers share the port (a change applied here would miss the other workers). "
    "Scale with `pdorch serve --workers 1`."
)


class WorkerStartError(RuntimeError):
    """A worker exited or stayed silent before it served."""


@dataclass(frozen=True)
class RestartBackoff:
    """How long the supervisor waits before restarting a worker that died.

    `delay(failures) = min(max_s, initial_s * factor ** (failures - 1))`, `failures` = deaths
    in a row (1 for the first); `failures_after(previous, uptime_s)` resets the count to 1 when
    the worker had stayed up `stable_s`. Defaults: 0.5 s, factor 2, at most 10 s, stable after
    30 s: a crash is repaired at once, a crash loop costs one start every 10 s, not a busy spin.
    """

    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 10.0
    stable_s: float = 30.0

    def delay(self, failures: int) -> float:
        return min(self.max_s, self.initial_s * self.factor ** max(0, failures - 1))

    def failures_after(self, previous: int, uptime_s: float) -> int:
        return 1 if uptime_s >= self.stable_s else previous + 1


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` with `SO_REUSEPORT` that never listens: it holds the port
    (the OS's pick for 0) for the workers' listening sockets, which join its reuse group; the
    kernel hands connections to listening sockets only. OSError when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _split(limit: int | None, workers: int) -> int | None:
    return None if limit is None else max(1, math.ceil(limit / workers))


def worker_fleet_config(
    fleet: FleetConfig,
    endpoints: Sequence[ReplicaEndpoint],
    *,
    workers: int,
    sync_bind: str,
    sync_peers: Sequence[str],
) -> dict[str, Any]:
    """One worker's fleet file (as a mapping): `fleet` with every pool's replicas as the static
    `endpoints` the supervisor started (same ids in every worker: shared load keys), a `sync:`
    section binding `sync_bind` and following `sync_peers`, one worker's share of the admission
    limits, no `slo_policy` and `coordinator.workers: 1`."""
    data = fleet.model_dump(mode="json")
    for pool, config in data["pools"].items():
        if config is None:
            continue
        config["launch"] = []
        config["endpoints"] = [
            {
                "id": e.replica_id,
                "url": e.url,
                "kv_events_endpoint": e.kv_events_endpoint,
                "kv_events_replay_endpoint": e.kv_events_replay_endpoint,
                "kv_events_topic": e.kv_events_topic,
                "metrics_url": e.metrics_url,
            }
            for e in endpoints
            if e.pool == pool
        ]
    coordinator = data["coordinator"]
    coordinator["workers"] = 1
    coordinator["max_concurrent_requests"] = _split(
        fleet.coordinator.max_concurrent_requests, workers
    )
    queue = fleet.coordinator.admission.max_queue
    coordinator["admission"]["max_queue"] = 0 if queue == 0 else _split(queue, workers)
    data["slo_policy"] = None
    data["sync"] = {"bind": sync_bind, "peers": list(sync_peers)}
    return data


def refusal(fleet: FleetConfig, *, slo_policy: bool) -> str | None:
    """Why this fleet cannot be served by several workers, or None."""
    if fleet.models is not None:
        return "several models (`models:`) are served by one process only"
    if fleet.sync is not None:
        return "`sync:` (coordinators on several hosts) is not combined with --workers yet"
    if fleet.discovery is not None:
        return "`discovery:` fleets change at run time; workers serve a fixed fleet"
    if slo_policy or fleet.slo_policy is not None:
        return "the in-process autoscaler (--slo-policy / slo_policy:) needs --workers 1"
    return None


async def _forward(stream: asyncio.StreamReader, index: int) -> None:
    while line := await stream.readline():
        sys.stderr.write(f"worker {index} (stdout): {line.decode(errors='replace')}")


@dataclass
class WorkerSlot:
    """One worker: what stays across its restarts (index, ports) and its current process."""

    index: int
    sync_endpoint: str
    private_port: int
    spec_path: Path
    process: asyncio.subprocess.Process | None = None
    pid: int | None = None
    url: str | None = None  # its private URL
    started_at: float = 0.0
    failures: int = 0
    restarts: int = 0

    def describe(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "pid": self.pid,
            "url": self.url,
            "sync": self.sync_endpoint,
            "restarts": self.restarts,
        }


@dataclass
class WorkerSupervisor:
    """Starts, watches, restarts and stops the workers (the module docstring).

    `start()` returns once every worker serves (WorkerStartError otherwise, nothing left
    running) and from then on restarts dead workers; `stop()` ends that, forwards SIGTERM and
    waits `stop_timeout_s` per worker before SIGKILL.
    """

    fleet: FleetConfig
    endpoints: Sequence[ReplicaEndpoint]
    host: str
    port: int
    workers: int
    log_level: str = "warning"
    start_timeout_s: float = 60.0
    stop_timeout_s: float = 15.0
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    slots: list[WorkerSlot] = field(default_factory=list)
    _stopping: bool = False
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _spec_dir: Path | None = None
    _watcher: asyncio.Future[Any] | None = None
    _drains: set[asyncio.Future[None]] = field(default_factory=set)

    async def start(self) -> None:
        self._spec_dir = Path(tempfile.mkdtemp(prefix="pdorch-workers-"))
        sync_ports = free_ports(self.workers)
        private_ports = free_ports(self.workers, self.host if ":" not in self.host else "::1")
        sync = [f"tcp://127.0.0.1:{p}" for p in sync_ports]
        for index in range(self.workers):
            spec = {
                "index": index,
                "workers": self.workers,
                "host": self.host,
                "port": self.port,
                "private_port": private_ports[index],
                "log_level": self.log_level,
                "fleet": worker_fleet_config(
                    self.fleet,
                    self.endpoints,
                    workers=self.workers,
                    sync_bind=sync[index],
                    sync_peers=sync,
                ),
            }
            path = self._spec_dir / f"worker-{index}.json"
            path.write_text(json.dumps(spec))
            self.slots.append(WorkerSlot(index, sync[index], private_ports[index], path))
        try:
            await asyncio.gather(*(self._spawn(slot) for slot in self.slots))
        except BaseException:
            await self.stop()
            raise
        self._watcher = asyncio.ensure_future(
            asyncio.gather(*(self._watch(slot) for slot in self.slots))
        )

    async def _spawn(self, slot: WorkerSlot) -> None:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pdorch.app.worker_main",
            str(slot.spec_path),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            # stderr: inherited, the workers log where `pdorch serve` logs
        )
        slot.process, slot.pid, slot.url = process, process.pid, None
        slot.started_at = time.monotonic()
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), self.start_timeout_s)
        except TimeoutError:
            line = None
        try:
            ready = json.loads(line) if line else None
        except ValueError:
            ready = None
        if not isinstance(ready, dict) or "url" not in ready:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            rc = await process.wait()
            why = f"silent for {self.start_timeout_s:.0f}s" if line is None else f"status {rc}"
            raise WorkerStartError(
                f"worker {slot.index} (pid {process.pid}) did not start ({why}; its log is above)"
            )
        slot.url = str(ready["url"])
        # anything the worker prints later goes to our stderr: an unread pipe would fill and
        # block the worker (stdout stays the supervisor's own `--json` line)
        drain = asyncio.ensure_future(_forward(process.stdout, slot.index))
        self._drains.add(drain)
        drain.add_done_callback(self._drains.discard)

    async def _watch(self, slot: WorkerSlot) -> None:
        while not self._stopping:
            assert slot.process is not None
            rc = await slot.process.wait()
            if self._stopping:
                return
            uptime = time.monotonic() - slot.started_at
            slot.failures = self.backoff.failures_after(slot.failures, uptime)
            delay = self.backoff.delay(slot.failures)
            log.warning(
                "worker %d (pid %d) exited with status %s after %.1fs; restarting it in %.1fs",
                slot.index,
                slot.pid,
                rc,
                uptime,
                delay,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            if self._stopping:
                return
            slot.restarts += 1
            try:
                await self._spawn(slot)
            except WorkerStartError as err:
                if not self._stopping:
                    log.error("%s; trying again", err)
                continue
            log.warning("worker %d restarted (pid %d, %s)", slot.index, slot.pid, slot.url)

    async def stop(self) -> None:
        """SIGTERM to every worker (each drains), SIGKILL to those still up after the timeout."""
        self._stopping = True
        self._wake.set()
        if self._watcher is not None:  # no restart may begin once the stop has begun
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None
        running = [s.process for s in self.slots if s.process and s.process.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)

        async def reap(process: asyncio.subprocess.Process) -> None:
            try:
                await asyncio.wait_for(process.wait(), self.stop_timeout_s)
            except TimeoutError:
                log.warning("worker pid %d still up after SIGTERM: killed", process.pid)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()

        await asyncio.gather(*(reap(p) for p in running))
        await asyncio.gather(*self._drains, return_exceptions=True)  # EOF: the workers are gone
        if self._spec_dir is not None:
            for path in self._spec_dir.glob("*.json"):
                path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                os.rmdir(self._spec_dir)
