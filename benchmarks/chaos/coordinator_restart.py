"""`kill-coordinator`: two `pdorch serve` (peer sync on) over one 2P+2D fleet, one killed.

Timeline (seconds from the load's start): both coordinators up and subscribed to each other's
sync; the load (`--concurrency` clients, client i on coordinator i % 2: each half streams half
not, as in the other scenarios) from 0; `kill -9` of coordinator 1 at `warmup_s`; started again
on the same HTTP and sync ports `down_s` later (a new process: empty KV index, rebuilt by
replaying every engine's KV events from 0; a new sync origin, so coordinator 0 drops the dead
one's entries at once when it hears the new incarnation, or after `peer_timeout_s`); load until
`settle_s` after it is ready; then stop, drain, and the figures. Clients whose request failed
before its first byte wait `REFUSED_BACKOFF_S` before the next (a client retrying a refused
connection). `/admin/pools` of both coordinators is read together every `poll_s`.

Figures (definitions: `convergence.py`, `scenarios.py`): per coordinator the usual outcome
counts (`sent`, `succeeded`, `failed_before_first_byte`, `broken_mid_stream`, `hung`, by kind);
for the killed one the same by phase (in flight at the kill: lost to their clients; while
down: refused; after ready: must all succeed); `restart.ready_s` (process start → `/health`
200, which waits for the KV-event join replay: 503 `replaying` until then) and
`restart.first_success_s` (process start → first byte of its first succeeded request);
`restart.kv_index_rebuilt_s` (ready → its index holds 95 % of the survivor's blocks on every
replica: 0 when the replay was done at ready);
`kv_index_at_ready` (the restarted coordinator's `indexed_blocks` per replica at its
first `/admin/pools`, beside the survivor's and the engines' `cached_blocks`);
`kv_index_after` per coordinator once the load stopped (must `match`); `restart.replays`: the
restarted coordinator's last KV-event replay per replica as its `/metrics` tells them
(`pdorch_kv_replay_last_seconds` / `_blocks`: seconds from asking the engine to the replay's
end, outcome, whether it was a join replay, blocks stored), read at its ready (`at_ready`: a
replica missing there had not ended its replay, `join_deadline_s` made it ready) and after
the load (`after_load`); `token_load` convergence
before the kill (steady state) and after the ready, and both coordinators' load after the drain
(exactly 0 everywhere); the survivor's replica states (no replica may leave its routing).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from benchmarks.chaos.convergence import (
    IndexSample,
    LoadSample,
    by_phase,
    convergence,
    first_success_after,
    index_rebuilt_after,
)
from benchmarks.chaos.fleet import ChaosFleet
from benchmarks.chaos.load import LoadSettings, run_load
from benchmarks.chaos.scenarios import (
    classify,
    first_errors,
    hung_requests,
    load_is_zero,
    token_load_left,
)
from benchmarks.live.client import RequestResult
from pools.http_client import http_client

if TYPE_CHECKING:
    from benchmarks.chaos.runner import ChaosConfig

NAME = "kill-coordinator"
KILLED = 1  # coordinator 1 is killed; coordinator 0 survives
REFUSED_BACKOFF_S = 0.2
SYNC_WAIT_S = 30.0

Status = Callable[[str], None]


async def _view(client: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    try:
        view: dict[str, Any] = (await client.get(f"{url}/admin/pools", timeout=2.0)).json()
    except (httpx.HTTPError, ValueError):
        return None
    return view


async def _poll_pair(
    client: httpx.AsyncClient,
    fleet: ChaosFleet,
    origin: float,
    samples: list[LoadSample],
    index_samples: list[IndexSample],
    not_healthy: dict[str, int],
    skews: list[float],
    poll_s: float,
) -> None:
    """Both coordinators' `/admin/pools` together; a sample when both answered; the survivor's
    polls where a replica is not healthy, counted per replica; `skews`: how far apart the two
    answers came (a starved box answers late, and the views differ by what changed between)."""

    async def timed(url: str) -> tuple[dict[str, Any] | None, float]:
        view = await _view(client, url)
        return view, time.perf_counter()

    while True:
        (a, ta), (b, tb) = await asyncio.gather(
            *(timed(c.url) for c in fleet.coordinators[: KILLED + 1])
        )
        t = time.perf_counter() - origin
        if a is not None and b is not None:
            skews.append(abs(ta - tb))
        if a is not None:
            for pool in a["pools"].values():
                for r in pool["replicas"]:
                    if r["state"] != "healthy":
                        not_healthy[r["id"]] = not_healthy.get(r["id"], 0) + 1
        if a is not None and b is not None:
            samples.append((t, token_load_left(a), token_load_left(b)))
            index_samples.append((t, _blocks(a), _blocks(b)))
        await asyncio.sleep(poll_s)


async def _wait_synced(client: httpx.AsyncClient, fleet: ChaosFleet, wait_s: float) -> bool:
    """Every coordinator holds a view of every other one (`sync.peers` counted)."""
    deadline = time.monotonic() + wait_s
    need = len(fleet.coordinators) - 1
    while time.monotonic() < deadline:
        views = await asyncio.gather(*(_view(client, c.url) for c in fleet.coordinators))
        if all(
            v is not None and len((v.get("sync") or {}).get("peers", {})) >= need for v in views
        ):
            return True
        await asyncio.sleep(0.05)
    return False


async def _engine_blocks(client: httpx.AsyncClient, fleet: ChaosFleet) -> dict[str, int | None]:
    blocks: dict[str, int | None] = {}
    for replica_id, spec in fleet.specs.items():
        try:
            info = (await client.get(f"{spec.url}/sim/info", timeout=2.0)).json()
            blocks[replica_id] = int(info["cached_blocks"])
        except (httpx.HTTPError, ValueError, KeyError):
            blocks[replica_id] = None
    return blocks


def _quantiles(values: list[float]) -> dict[str, float] | None:
    """p50 / p90 / max of `values` (seconds, rounded), None when empty."""
    if not values:
        return None
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50": pick(0.5), "p90": pick(0.9), "max": round(ordered[-1], 3)}


_REPLAY_SECONDS = re.compile(
    r'^pdorch_kv_replay_last_seconds\{join="(\w+)",outcome="(\w+)",replica="([^"]+)"\} (\S+)$',
    re.MULTILINE,
)
_REPLAY_BLOCKS = re.compile(
    r'^pdorch_kv_replay_last_blocks\{replica="([^"]+)"\} (\S+)$', re.MULTILINE
)


def replay_records(metrics: str) -> dict[str, dict[str, Any]]:
    """Each replica's last KV-event replay from a coordinator's `/metrics` text:
    `{replica: {"seconds", "outcome", "join", "blocks"}}` (module doc)."""
    records: dict[str, dict[str, Any]] = {}
    for join, outcome, replica, value in _REPLAY_SECONDS.findall(metrics):
        records[replica] = {
            "seconds": round(float(value), 3),
            "outcome": outcome,
            "join": join == "true",
        }
    for replica, value in _REPLAY_BLOCKS.findall(metrics):
        if replica in records:
            records[replica]["blocks"] = int(float(value))
    return records


async def _replays(client: httpx.AsyncClient, url: str) -> dict[str, dict[str, Any]] | None:
    try:
        return replay_records((await client.get(f"{url}/metrics", timeout=2.0)).text)
    except httpx.HTTPError:
        return None


def _blocks(view: dict[str, Any]) -> dict[str, int]:
    return {k: v for k, v in _indexed(view).items() if v is not None}


def _indexed(view: dict[str, Any] | None) -> dict[str, int | None]:
    if view is None:
        return {}
    return {r["id"]: r.get("indexed_blocks") for p in view["pools"].values() for r in p["replicas"]}


async def run_kill_coordinator(
    config: ChaosConfig,
    log_dir: Path,
    on_request: Callable[[RequestResult], None] | None = None,
    on_status: Status | None = None,
) -> dict[str, Any]:
    """The scenario on a fresh fleet; its JSON row (see the module docstring)."""
    from benchmarks.chaos.runner import kv_index_vs_engines  # runner imports this module

    status = on_status or (lambda _: None)
    fleet = ChaosFleet(config.fleet, log_dir)
    status(f"{NAME}: starting 2P+2D engines and two pdorch serve (peer sync)")
    load_before = os.getloadavg()
    half = max(1, config.load.concurrency // 2)
    per_coordinator = LoadSettings(
        concurrency=half,
        max_tokens=config.load.max_tokens,
        prompt_words=config.load.prompt_words,
        request_timeout_s=config.load.request_timeout_s,
    )
    try:
        await fleet.start(coordinators=2)
        async with http_client(timeout=10.0) as client:
            synced = await _wait_synced(client, fleet, SYNC_WAIT_S)
            origin = time.perf_counter()
            stop = asyncio.Event()
            samples: list[LoadSample] = []
            index_samples: list[IndexSample] = []
            not_healthy: dict[str, int] = {}
            skews: list[float] = []
            poller = asyncio.create_task(
                _poll_pair(
                    client,
                    fleet,
                    origin,
                    samples,
                    index_samples,
                    not_healthy,
                    skews,
                    config.poll_s,
                )
            )
            # the URLs are fixed (same ports after the restart): each load keeps its own
            loads = [
                asyncio.create_task(
                    run_load(
                        c.url,
                        config.fleet.served_model_name,
                        per_coordinator,
                        stop,
                        origin,
                        on_request,
                        backoff_s=REFUSED_BACKOFF_S,
                    )
                )
                for c in fleet.coordinators
            ]
            status(f"{NAME}: load for {config.warmup_s:g}s")
            await asyncio.sleep(config.warmup_s)
            status(f"{NAME}: kill -9 coordinator {KILLED}, down {config.down_s:g}s")
            killed_at = time.perf_counter() - origin
            fleet.kill_coordinator(KILLED)
            await asyncio.sleep(config.down_s)
            restart_at = time.perf_counter() - origin
            await fleet.restart_coordinator(KILLED)
            ready_at = time.perf_counter() - origin
            first_view = await _view(client, fleet.coordinators[KILLED].url)
            replays_at_ready = await _replays(client, fleet.coordinators[KILLED].url)
            at_ready = {
                "after_ready_s": round(time.perf_counter() - origin - ready_at, 3),
                "restarted": _indexed(first_view),
                "survivor": _indexed(await _view(client, fleet.coordinators[0].url)),
                "engine": await _engine_blocks(client, fleet),
            }
            status(f"{NAME}: restarted; load for {config.settle_s:g}s more")
            await asyncio.sleep(config.settle_s)
            stop.set()
            status(f"{NAME}: load stopped, waiting for requests in flight")
            per = [await load for load in loads]
            load_stopped_at = time.perf_counter() - origin
            deadline = time.monotonic() + config.drain_wait_s
            views = [await _view(client, c.url) for c in fleet.coordinators]
            while (
                not all(v is not None and load_is_zero(v) for v in views)
                and time.monotonic() < deadline
            ):
                await asyncio.sleep(config.poll_s)
                views = [await _view(client, c.url) for c in fleet.coordinators]
            zero_after_s = time.perf_counter() - origin - load_stopped_at
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            replays_after = await _replays(client, fleet.coordinators[KILLED].url)
            kv_after: dict[str, Any] = {}
            counters: dict[str, Any] = {}
            for i, c in enumerate(fleet.coordinators):
                async with http_client(base_url=c.url, timeout=10.0) as admin:
                    kv_after[str(i)] = await kv_index_vs_engines(
                        admin, fleet, config.drain_wait_s, config.poll_s
                    )
                    view = (await admin.get("/admin/pools")).json()
                    counters[str(i)] = {
                        "kv_events": view.get("kv_events"),
                        "sync": view.get("sync"),
                    }
    finally:
        fleet.close()
    coordinators: dict[str, Any] = {}
    for i, results in enumerate(per):
        view = views[i]
        row: dict[str, Any] = {
            **classify(results),
            "by_kind": {
                k: classify([r for r in results if r.group == k]) for k in ("stream", "whole")
            },
            "errors": first_errors(results),
            "hung_requests": hung_requests(results),
            "token_load_zero": view is not None and load_is_zero(view),
            "token_load_after": None if view is None else token_load_left(view),
            "tracked_requests_after": None if view is None else view.get("tracked_requests"),
            "kv_index_after": kv_after[str(i)],
            "kv_event_counters": counters[str(i)]["kv_events"],
            "sync": counters[str(i)]["sync"],
        }
        if i == KILLED:
            row["by_phase"] = by_phase(results, killed_at, ready_at)
        coordinators[str(i)] = row
    everything = [r for results in per for r in results]
    zero = all(c["token_load_zero"] for c in coordinators.values())
    return {
        "scenario": NAME,
        "description": "kill -9 one of two coordinators (peer sync), restart it on the same port",
        "replicas": [],
        **classify(everything),
        "by_kind": {
            k: classify([r for r in everything if r.group == k]) for k in ("stream", "whole")
        },
        "routing": {},  # no engine is faulted (the survivor's replica states: below)
        "token_load_zero": zero,
        "kv_index": {"match": all(kv["match"] for kv in kv_after.values())},
        "errors": first_errors(everything),
        "coordinators": coordinators,
        "synced_before_load": synced,
        "killed_at_s": round(killed_at, 3),
        "restart_at_s": round(restart_at, 3),
        "restart": {
            "ready_s": round(ready_at - restart_at, 3),
            "first_success_s": first_success_after(per[KILLED], restart_at),
            # ready -> its index holds >= 95 % of the survivor's blocks on every replica
            "kv_index_rebuilt_s": index_rebuilt_after(index_samples, ready_at),
            "replays": {"at_ready": replays_at_ready, "after_load": replays_after},
        },
        "kv_index_at_ready": at_ready,
        # (t, survivor's blocks, restarted's blocks) summed over replicas, from the ready on
        "kv_index_trace": [
            [round(t, 2), sum(a.values()), sum(b.values())]
            for t, a, b in index_samples
            if t >= ready_at
        ],
        "token_load": {
            "before_kill": convergence(samples, 0.0, killed_at),
            "after_ready": convergence(samples, ready_at, load_stopped_at),
            "zero_after_drain": zero,
            "poll_skew_s": _quantiles(skews),
            "zero_after_s": round(zero_after_s, 3) if zero else None,
        },
        "survivor_polls_not_healthy": not_healthy,
        "load_stopped_at_s": round(load_stopped_at, 3),
        "loadavg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }
