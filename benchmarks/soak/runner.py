"""One soak run: a 2P+2D fleet under steady load for `duration_s`, an engine restarted every
`restart_every_s`, the coordinator sampled every `sample_s`.

Timeline (seconds from the load's start): the closed-loop chaos load (`benchmarks.chaos.load`,
`concurrency` clients, half streaming) from 0 to `duration_s`; at `k * restart_every_s`
(k = 1, 2, ... while before `duration_s`) engine `ROTATION[(k - 1) % 4]` is restarted on its
ports: odd k with SIGTERM (a graceful stop: its streams end, its KV-event sequence restarts),
even k with `kill -9` and `down_s` later started again. Then no new request starts, every one in
flight is awaited, the token load is polled to 0 and the prefill engines' KV leases to 0 (up to
`drain_wait_s` each), and one last sample is taken (`after`).

A sample (`sample`): the coordinator process (`probe.py`: RSS, fds, sockets, connections to
engines' HTTP and KV-event ports, client connections), `/admin/pools` (KV index size = the sum
of `indexed_blocks`, the token load summed over replicas, requests tracked and in flight,
replicas not healthy), the prefill engines' KV leases held (`/sim/info` `num_held_requests`),
and the client's cumulative requests ok / failed (and ok per second since the last sample).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from benchmarks.chaos.fleet import ChaosFleet, FleetSettings
from benchmarks.chaos.load import LoadSettings, run_load
from benchmarks.chaos.scenarios import classify, first_errors, load_is_zero, token_load_left
from benchmarks.live.client import RequestResult
from benchmarks.proxy.processes import stop_process
from benchmarks.soak.probe import sample_process
from benchmarks.soak.trend import verdict
from pools.drain import held_leases
from pools.http_client import http_client

ROTATION = ("prefill-0", "decode-0", "prefill-1", "decode-1")


@dataclass(frozen=True, slots=True)
class SoakConfig:
    duration_s: float = 1800.0
    restart_every_s: float = 180.0
    sample_s: float = 10.0
    # the coordinator's bounded caches fill first (the engine-tokenize LRU of 4096 prompts, the
    # token-load tombstones of 300 s): at 8 clients that took 9 minutes in the committed run
    warmup_s: float = 600.0
    down_s: float = 2.0
    drain_wait_s: float = 15.0
    load: LoadSettings = field(default_factory=lambda: LoadSettings(concurrency=8))
    # a small KV pool (2048 blocks of 16 tokens per engine) fills inside the warm-up at this
    # load, so the index is at its steady size (evicting) when the slopes are measured
    fleet: FleetSettings = field(default_factory=lambda: FleetSettings(num_blocks=2048))
    log_dir: Path | None = None


Progress = Callable[[dict[str, Any]], None]
Status = Callable[[str], None]


@dataclass
class _Counts:
    ok: int = 0
    failed: int = 0
    results: list[RequestResult] = field(default_factory=list)

    def done(self, result: RequestResult) -> None:
        self.results.append(result)
        if result.ok:
            self.ok += 1
        else:
            self.failed += 1


class Sampler:
    """Reads the coordinator and the engines (see the module docstring)."""

    def __init__(self, fleet: ChaosFleet, admin: httpx.AsyncClient, counts: _Counts) -> None:
        self.fleet = fleet
        self.admin = admin
        self.counts = counts
        specs = fleet.specs.values()
        self.http_ports = {s.port for s in specs}
        self.zmq_ports = {p for s in specs for p in (s.kv_events_port, s.replay_port)}
        port = urlsplit(fleet.url).port
        assert port is not None
        self.own_port = port
        self._last: tuple[float, int] | None = None

    async def view(self) -> dict[str, Any]:
        view: dict[str, Any] = (await self.admin.get("/admin/pools", timeout=5.0)).json()
        return view

    async def leases(self) -> int:
        prefill = [s.url for s in self.fleet.specs.values() if s.role == "prefill"]
        counts = await asyncio.gather(*(held_leases(self.admin, url) for url in prefill))
        return sum(counts)

    async def sample(self, t_s: float) -> dict[str, Any]:
        assert self.fleet.coordinator is not None
        proc = sample_process(
            self.fleet.coordinator.pid, self.http_ports, self.zmq_ports, self.own_port
        )
        view, leases = await asyncio.gather(self.view(), self.leases())
        loads = token_load_left(view).values()
        replicas = [r for pool in view["pools"].values() for r in pool["replicas"]]
        ok_per_s = None
        if self._last is not None and t_s > self._last[0]:
            ok_per_s = round((self.counts.ok - self._last[1]) / (t_s - self._last[0]), 3)
        self._last = (t_s, self.counts.ok)
        return {
            "t_s": round(t_s, 2),
            **asdict(proc),
            "kv_leases": leases,
            "index_blocks": sum(int(r["indexed_blocks"] or 0) for r in replicas),
            "tracked_requests": view["tracked_requests"],
            "requests_in_flight": view["requests_in_flight"],
            "token_load_decode_blocks": sum(load["decode_blocks"] for load in loads),
            "token_load_prefill_tokens": sum(load["prefill_tokens_queued"] for load in loads),
            "token_load_requests": sum(load["requests_in_flight"] for load in loads),
            "requests_ok": self.counts.ok,
            "requests_failed": self.counts.failed,
            "ok_per_s": ok_per_s,
            "not_healthy": sorted(r["id"] for r in replicas if r["state"] != "healthy"),
        }


async def _restart(fleet: ChaosFleet, replica: str, hard: bool, down_s: float) -> None:
    """SIGTERM (graceful) or kill -9, then the same command on the same ports. The waits for
    the old process run off the event loop: the load's clients share it."""
    proc = fleet.engines[replica]
    if hard:
        await asyncio.to_thread(fleet.kill, replica)
        await asyncio.sleep(down_s)
    else:
        await asyncio.to_thread(stop_process, proc, 5.0)
    await fleet.restart(replica)


async def run_soak(
    config: SoakConfig, on_sample: Progress | None = None, on_status: Status | None = None
) -> dict[str, Any]:
    """The whole run; `{"config", "samples", "restarts", "after", "requests", "trend"}`."""
    status = on_status or (lambda _: None)
    with contextlib.ExitStack() as stack:
        log_dir = config.log_dir
        if log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-")))
        log_dir.mkdir(parents=True, exist_ok=True)
        fleet = ChaosFleet(config.fleet, log_dir)
        status("starting 2P+2D engines and pdorch serve")
        try:
            await fleet.start()
            result = await _run(fleet, config, on_sample, status)
        finally:
            fleet.close()
    result["config"] = _config_view(config)
    result["trend"] = verdict(result["samples"], config.warmup_s)
    return result


async def _run(
    fleet: ChaosFleet, config: SoakConfig, on_sample: Progress | None, status: Status
) -> dict[str, Any]:
    counts = _Counts()
    samples: list[dict[str, Any]] = []
    restarts: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    async with http_client(base_url=fleet.url, timeout=10.0) as admin:
        sampler = Sampler(fleet, admin, counts)
        origin = time.perf_counter()

        def now() -> float:
            return time.perf_counter() - origin

        stop = asyncio.Event()
        load = asyncio.create_task(
            run_load(
                fleet.url, config.fleet.served_model_name, config.load, stop, origin, counts.done
            )
        )

        async def sample_loop() -> None:
            k = 0
            while True:
                k += 1
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, OSError):
                    sample = await sampler.sample(now())
                    samples.append(sample)
                    if on_sample is not None:
                        on_sample(sample)
                await asyncio.sleep(max(0.0, k * config.sample_s - now()))

        async def restart_loop() -> None:
            k = 1
            while k * config.restart_every_s < config.duration_s:
                await asyncio.sleep(max(0.0, k * config.restart_every_s - now()))
                replica, hard = ROTATION[(k - 1) % len(ROTATION)], k % 2 == 0
                status(f"restarting {replica} ({'kill -9' if hard else 'SIGTERM'})")
                at = now()
                await _restart(fleet, replica, hard, config.down_s)
                restarts.append(
                    {
                        "t_s": round(at, 2),
                        "replica": replica,
                        "mode": "kill -9" if hard else "SIGTERM",
                        "ready_after_s": round(now() - at, 2),
                    }
                )
                status(f"load for {config.duration_s:g}s; {len(restarts)} restarts")
                k += 1

        status(f"load for {config.duration_s:g}s")
        sampling = asyncio.create_task(sample_loop())
        restarting = asyncio.create_task(restart_loop())
        await asyncio.sleep(max(0.0, config.duration_s - now()))
        status("load stopped, waiting for requests in flight")
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            # an engine restart under way is finished (a half-started fleet is not the point)
            await asyncio.wait_for(asyncio.shield(restarting), config.fleet.start_timeout_s)
        restarting.cancel()
        stop.set()
        results = await load
        stopped_at = now()
        sampling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampling
        deadline = time.monotonic() + config.drain_wait_s
        view = await sampler.view()
        while not load_is_zero(view) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            view = await sampler.view()
        zero_after_s = now() - stopped_at
        deadline = time.monotonic() + config.drain_wait_s
        while time.monotonic() < deadline:
            if await sampler.leases() == 0:
                break
            await asyncio.sleep(0.1)
        after = await sampler.sample(now())
        metrics = (await admin.get("/metrics")).text
    capacity = {
        r["id"]: r["kv_capacity_blocks"] for p in view["pools"].values() for r in p["replicas"]
    }
    indexed = {r["id"]: r["indexed_blocks"] for p in view["pools"].values() for r in p["replicas"]}
    return {
        "samples": samples,
        "restarts": restarts,
        "after": {
            **after,
            "token_load_zero": load_is_zero(view),
            "token_load_zero_after_s": round(zero_after_s, 3),
            "token_load": token_load_left(view),
            "indexed_blocks": indexed,
            "kv_capacity_blocks": capacity,
            "kv_events": view.get("kv_events"),
            "migrations": _counter_sum(metrics, "pdorch_migrations_total{"),
        },
        "requests": {**classify(results), "errors": first_errors(results, limit=5)},
        "load_stopped_at_s": round(stopped_at, 2),
        "loadavg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }


def _counter_sum(metrics: str, prefix: str) -> int:
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(prefix):
            total += float(line.rpartition(" ")[2])
    return int(total)


def _config_view(config: SoakConfig) -> dict[str, Any]:
    view = asdict(config)
    view["log_dir"] = None if config.log_dir is None else str(config.log_dir)
    return view
