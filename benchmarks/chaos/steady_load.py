"""The steady high-priority clients that `overload-mixed` and `connect-storm` run beside their
bursts, on a fleet with admission on: one setup, start and drain for both scenarios.

Fleet (`admission_fleet`): the 2P+2D fleet of the other scenarios with the coordinator's
`max_concurrent_requests` = `concurrency` + `int(concurrency * headroom)` (`admission_limit`),
`admission.max_queue` = `concurrency` and `admission.max_wait_s` = the scenario's `max_wait_s`.
Clients (`start_steady`): `load.py`'s closed loop, every request with `x-pdorch-priority:
steady_priority`; one shed with a 429 before its first byte waits `retry_after_s` (the
coordinator's `Retry-After`) before its next. Drain (`stop_and_drain`): no new request starts,
all in flight are awaited, `/admin/pools` is polled up to `drain_wait_s` for nothing queued,
nothing in flight and every replica's token load at 0 (`drained`); then the queue poller is
stopped and the coordinator's own `pdorch_rejected_total` by reason is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import httpx

from benchmarks.chaos.fleet import ChaosFleet, FleetSettings
from benchmarks.chaos.load import LoadSettings, run_load
from benchmarks.chaos.scenarios import load_is_zero
from benchmarks.live.client import RequestResult
from pdorch.app.admission import PRIORITY_HEADER

REJECTED = re.compile(rb'^pdorch_rejected_total\{reason="([a-z_]+)"\} (\S+)$', re.MULTILINE)


class SteadySettings(Protocol):
    """What both scenarios' settings (`MixedSettings`, `StormSettings`) say about the steady
    clients and the admission they run under."""

    @property
    def headroom(self) -> float: ...
    @property
    def max_wait_s(self) -> float: ...
    @property
    def steady_priority(self) -> int: ...
    @property
    def retry_after_s(self) -> float: ...


def admission_limit(load: LoadSettings, settings: SteadySettings) -> int:
    return load.concurrency + int(load.concurrency * settings.headroom)


def admission_fleet(
    fleet_settings: FleetSettings, load: LoadSettings, settings: SteadySettings, log_dir: Path
) -> ChaosFleet:
    """The fleet with admission on (module doc); not started."""
    admission = replace(
        fleet_settings,
        max_concurrent_requests=admission_limit(load, settings),
        max_queue=load.concurrency,
        max_wait_s=settings.max_wait_s,
    )
    return ChaosFleet(admission, log_dir)


@dataclass(frozen=True, slots=True)
class Timeline:
    """Seconds of the steady load before the burst (`warmup_s`; at least the scenario's
    `min_warmup_s`) and after its last answer (`settle_s`), the poll interval, and how long the
    drain may take (`ChaosConfig`'s, `--warmup-s`, `--settle-s`)."""

    warmup_s: float
    settle_s: float
    poll_s: float
    drain_wait_s: float


@dataclass(frozen=True, slots=True)
class SteadyClients:
    """The running steady load: set `stop` and await `task` for every request's result."""

    stop: asyncio.Event
    task: asyncio.Task[list[RequestResult]]


def start_steady(
    url: str, model: str, load: LoadSettings, settings: SteadySettings, origin: float
) -> SteadyClients:
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_load(
            url,
            model,
            load,
            stop,
            origin,
            backoff_s=settings.retry_after_s,
            headers={PRIORITY_HEADER: str(settings.steady_priority)},
        )
    )
    return SteadyClients(stop, task)


def drained(view: dict[str, Any]) -> bool:
    return (
        load_is_zero(view) and view.get("requests_queued") == 0 and view["requests_in_flight"] == 0
    )


def rejected_counts(metrics_text: bytes) -> dict[str, int]:
    """`pdorch_rejected_total` by reason from a `/metrics` answer (the coordinator's own count
    of what it shed, to hold against what the clients saw)."""
    return {m.group(1).decode(): int(float(m.group(2))) for m in REJECTED.finditer(metrics_text)}


async def stop_and_drain(
    steady: SteadyClients,
    admin: httpx.AsyncClient,
    url: str,
    poller: asyncio.Task[None],
    timeline: Timeline,
) -> tuple[list[RequestResult], dict[str, Any], dict[str, int]]:
    """(the steady results, the last `/admin/pools` view, `rejected_counts`): module doc."""
    steady.stop.set()
    results = await steady.task
    deadline = time.monotonic() + timeline.drain_wait_s
    view = (await admin.get(url + "/admin/pools")).json()
    while not drained(view) and time.monotonic() < deadline:
        await asyncio.sleep(timeline.poll_s)
        view = (await admin.get(url + "/admin/pools")).json()
    poller.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await poller
    rejected = rejected_counts((await admin.get(url + "/metrics")).content)
    return results, view, rejected


def no_fault_row() -> dict[str, Any]:
    """The outcome keys of a fault scenario's row, as a burst scenario (no fault, no replica
    broken, its own figures instead) fills them."""
    return {
        "replicas": [],
        "broken_mid_stream": 0,
        "hung": 0,
        "by_kind": {"stream": {"hung": 0}, "whole": {"hung": 0}},
        "routing": {},
    }
