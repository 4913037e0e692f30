"""The `overload-mixed` scenario: a 10x burst arrives while the steady load runs, with mixed
priorities; does the important traffic keep its latency?

Fleet: the 2P+2D fleet of the other scenarios; the coordinator with `max_concurrent_requests`
= `concurrency` + `concurrency * headroom` (48 for 32 clients and headroom 0.5: the steady load
and half as much again), `admission.max_queue` = `concurrency` (32), `admission.max_wait_s` =
`max_wait_s` (2 s).

Timeline (seconds from the load's start): the steady load (`load.py`: `concurrency` clients,
even ones streaming, odd ones not, back to back), every request with `x-pdorch-priority:
steady_priority` (10, high) from 0; at `warmup_s` (at least `min_warmup_s`, 10 s) a burst of
`burst_factor x concurrency` (320) streamed requests at once (bare asyncio connections,
`overload.send_stream`), their priorities `burst_priorities` in turn (0 normal, -10 low: half
each); the steady load runs on until `settle_s` after the burst's last answer; then no new
request starts, all in flight are awaited, and `/admin/pools` is polled up to `drain_wait_s`
for nothing queued, nothing in flight and every replica's token load at 0. A steady client
shed with a 429 waits the answer's `Retry-After` (1 s) before its next request.

Figures (`burst_figures`, `steady_figures`, `steady_windows`: pure), per priority class
(`high` the steady clients, `normal`, `low` the burst): `sent`; `admitted` (a 200 head); `ok`
(200, the stream to `[DONE]` / the whole answer); `shed` (429) with `shed_with_retry_after`
and `shed_reasons` (`concurrency`: over the limit with the queue full; `displaced`: queued,
then its place taken by a higher priority; `queue_timeout`: queued past `max_wait_s`);
`other_errors` (must be 0; `server_errors_5xx` among them); `shed_latency_s` p50/p99/max
(send → the 429's head); `admitted_ttft_s` p50/p99 (send → first SSE event, queue wait
included; streamed requests only). The steady clients' streamed TTFT p50/p99/max and
non-streamed latency p99 `before` (started in [`SKIP_START_S`, burst): the first second is
every client's first request at once), `during` (started in [burst, the burst's last answer])
and `after` (later). A burst request with no whole answer within the load's
`request_timeout_s` (120 s) counts as an other error (`no whole answer within ...`).
`queue`: the most `requests_queued` and `requests_in_flight` seen in the polls, and both
after the drain; `coordinator_rss_mib`: the VmHWM (high-water mark) at idle
and at the end; `loop_lag_s_max_polled`: the largest `pdorch_event_loop_lag_seconds` (the
coordinator's last lag probe) seen in the polls; `head_shed_max_lag_s`: the lag bound the
coordinator ran with (`FleetSettings.head_shed_max_lag_s`, `--head-shed-max-lag-s`; None: its
default); `head_shed_max_pending`: its `max_pending_requests` (`--head-shed-max-pending`; None:
its default). Shed reasons also `loop_lag` / `pending` (429 at the request head, `head_shed.py`).
`steady_bins`: the steady streamed TTFT p50/p99 in 5 s windows from the burst on (12 of
them), to compare runs whose bursts last differently. `coordinator_rejected`: the
coordinator's own `pdorch_rejected_total` by reason after the drain (what it shed, against
what the clients saw); `cpu_during_burst`: the CPU seconds and cores (CPU s / wall s; 1.0 =
one core busy the whole time) of the bench client process (the steady clients, the burst's
sockets, the poller: one event loop) and of the coordinator from the burst's start to its
last answer, so a run can tell whether the client was its bottleneck.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from benchmarks.chaos.fleet import FleetSettings
from benchmarks.chaos.load import LoadSettings, payload
from benchmarks.chaos.overload import Answer, quantile, rss_peak_mib, send_stream
from benchmarks.chaos.scenarios import load_is_zero, token_load_left
from benchmarks.chaos.steady_load import (
    Timeline,
    admission_fleet,
    admission_limit,
    no_fault_row,
    start_steady,
    stop_and_drain,
)
from benchmarks.live.client import RequestResult
from pdorch.app.admission import PRIORITY_HEADER
from pools.http_client import http_client

NAME = "overload-mixed"
SKIP_START_S = 1.0
CLASSES = {10: "high", 0: "normal", -10: "low"}


@dataclass(frozen=True, slots=True)
class MixedSettings:
    burst_factor: int = 10
    headroom: float = 0.5
    max_wait_s: float = 2.0
    steady_priority: int = 10
    burst_priorities: tuple[int, ...] = (0, -10)
    retry_after_s: float = 1.0  # what a shed steady client waits (the coordinator's default)
    # the burst waits at least this long (or `warmup_s` when longer): the steady clients' first
    # requests all start at once, so "before" needs their second and later ones
    min_warmup_s: float = 10.0


@dataclass(frozen=True, slots=True)
class Sent:
    """One burst request: its priority, when it was sent (s from the load's start), and how
    it was answered."""

    priority: int
    start_s: float
    answer: Answer


def class_name(priority: int) -> str:
    return CLASSES.get(priority, f"priority {priority}")


def shed_reason(body: bytes) -> str:
    """`queue_timeout`, `displaced`, `concurrency` (admission), `loop_lag` or `pending`
    (shed at the head, `pdorch/app/head_shed.py`), from a 429's message (each names its
    reason)."""
    for reason in ("queue_timeout", "displaced", "loop_lag", "pending"):
        if f": {reason};".encode() in body:
            return reason
    return "concurrency"


def _latencies(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "p50": quantile(list(values), 0.5),
        "p99": quantile(list(values), 0.99),
        "max": quantile(list(values), 1.0),
    }


def burst_figures(sent: Sequence[Sent]) -> dict[str, Any]:
    """One class's figures from its burst requests (module doc)."""
    answers = [s.answer for s in sent]
    ok = [a for a in answers if a.status == 200 and a.error is None]
    shed = [a for a in answers if a.status == 429]
    other = [a for a in answers if a.status not in (200, 429) or (a.status == 200 and a.error)]
    reasons: dict[str, int] = {}
    for a in shed:
        reason = shed_reason(a.body)
        reasons[reason] = reasons.get(reason, 0) + 1
    return {
        "sent": len(answers),
        "admitted": sum(1 for a in answers if a.status == 200),
        "ok": len(ok),
        "shed": len(shed),
        "shed_with_retry_after": sum(1 for a in shed if a.retry_after),
        "shed_reasons": reasons,
        "other_errors": len(other),
        "server_errors_5xx": sum(1 for a in other if a.status is not None and a.status >= 500),
        "shed_latency_s": _latencies([a.total_s for a in shed]),
        "admitted_ttft_s": {
            "p50": quantile([a.first_byte_s for a in ok if a.first_byte_s is not None], 0.5),
            "p99": quantile([a.first_byte_s for a in ok if a.first_byte_s is not None], 0.99),
        },
        "errors": sorted({a.error or f"HTTP {a.status}" for a in other})[:5],
    }


def steady_figures(results: Sequence[RequestResult]) -> dict[str, Any]:
    """The same figures for the steady clients (`RequestResult`s of `load.py`)."""
    shed = [r for r in results if (r.error or "").startswith("HTTP 429")]
    ok = [r for r in results if r.ok]
    other = [r for r in results if not r.ok and r not in shed]
    reasons: dict[str, int] = {}
    for r in shed:
        reason = shed_reason((r.error or "").encode())
        reasons[reason] = reasons.get(reason, 0) + 1
    streamed = [r.ttft_s for r in ok if r.group == "stream" and r.ttft_s is not None]
    return {
        "sent": len(results),
        "admitted": len(results) - len(shed) - sum(1 for r in other if r.ttft_s is None),
        "ok": len(ok),
        "shed": len(shed),
        "shed_reasons": reasons,
        "other_errors": len(other),
        "shed_latency_s": _latencies([r.end_s - r.start_s for r in shed]),
        "admitted_ttft_s": {"p50": quantile(streamed, 0.5), "p99": quantile(streamed, 0.99)},
        "errors": sorted({(r.error or "")[:160] for r in other})[:5],
    }


def steady_windows(
    results: Sequence[RequestResult], burst_at: float, burst_end: float
) -> dict[str, dict[str, Any]]:
    """The steady clients' latency before / during / after the burst (module doc)."""
    windows = {
        "before": (SKIP_START_S, burst_at),
        "during": (burst_at, burst_end),
        "after": (burst_end, float("inf")),
    }
    out: dict[str, dict[str, Any]] = {}
    for name, (lo, hi) in windows.items():
        inside = [r for r in results if lo <= r.start_s < hi and r.ok]
        ttft = [r.ttft_s for r in inside if r.group == "stream" and r.ttft_s is not None]
        whole = [r.end_s - r.start_s for r in inside if r.group == "whole"]
        out[name] = {
            "window_s": [round(lo, 3), None if hi == float("inf") else round(hi, 3)],
            "streams": len(ttft),
            "ttft_s": _latencies(ttft),
            "whole": len(whole),
            "whole_latency_p99_s": quantile(whole, 0.99),
        }
    return out


def steady_bins(
    results: Sequence[RequestResult], burst_at: float, bin_s: float = 5.0, bins: int = 12
) -> list[dict[str, Any]]:
    """The steady clients' streamed TTFT in equal windows from the burst on (`bin_s` each,
    `bins` of them): runs whose burst lasts longer or shorter compare window by window, not
    over a "during" that has a different length in each."""
    out: list[dict[str, Any]] = []
    for i in range(bins):
        lo, hi = burst_at + i * bin_s, burst_at + (i + 1) * bin_s
        ttft = [
            r.ttft_s
            for r in results
            if lo <= r.start_s < hi and r.ok and r.group == "stream" and r.ttft_s is not None
        ]
        out.append(
            {
                "from_burst_s": round(i * bin_s, 3),
                "streams": len(ttft),
                "p50": quantile(ttft, 0.5),
                "p99": quantile(ttft, 0.99),
            }
        )
    return out


LAG = re.compile(rb"^pdorch_event_loop_lag_seconds (\S+)$", re.MULTILINE)


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far (/proc/PID/stat); None off Linux."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _share(cpu: tuple[float | None, float | None], wall_s: float) -> dict[str, float | None]:
    used = None if cpu[0] is None or cpu[1] is None else cpu[1] - cpu[0]
    return {
        "cpu_s": None if used is None else round(used, 2),
        "cores": None if used is None or wall_s <= 0 else round(used / wall_s, 2),
    }


async def _poll_queue(
    client: httpx.AsyncClient, url: str, seen: dict[str, float], poll_s: float
) -> None:
    while True:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            view = (await client.get(url + "/admin/pools", timeout=2.0)).json()
            for key in ("requests_queued", "requests_in_flight"):
                seen[key] = max(seen.get(key, 0), int(view[key]))
            lag = LAG.search((await client.get(url + "/metrics", timeout=2.0)).content)
            if lag is not None:  # the last probe's lag at each poll (a sample, not the max)
                seen["loop_lag_s"] = max(seen.get("loop_lag_s", 0.0), float(lag.group(1)))
        await asyncio.sleep(poll_s)


async def run_overload_mixed(
    fleet_settings: FleetSettings,
    load: LoadSettings,
    settings: MixedSettings,
    log_dir: Path,
    timeline: Timeline,
) -> dict[str, Any]:
    """The scenario on a fresh fleet; its JSON row (the outcome keys of the other rows, over
    every request, plus `classes`, `steady`, `queue`, `coordinator_rss_mib`)."""
    limit = admission_limit(load, settings)
    fleet = admission_fleet(fleet_settings, load, settings, log_dir)
    size = settings.burst_factor * load.concurrency
    cycle = settings.burst_priorities
    priorities = [cycle[i % len(cycle)] for i in range(size)]
    load_before = os.getloadavg()
    try:
        await fleet.start()
        assert fleet.coordinator is not None
        rss_idle = rss_peak_mib(fleet.coordinator.pid)
        host, port = urlsplit(fleet.url).hostname or "127.0.0.1", urlsplit(fleet.url).port or 80
        model = fleet_settings.served_model_name
        bodies = [payload(model, load, stream=True) for _ in range(size)]  # built before timing
        async with http_client(timeout=10.0) as admin:
            seen: dict[str, float] = {}
            poller = asyncio.create_task(_poll_queue(admin, fleet.url, seen, timeline.poll_s))
            origin = time.perf_counter()
            steady = start_steady(fleet.url, model, load, settings, origin)
            await asyncio.sleep(max(timeline.warmup_s, settings.min_warmup_s))
            burst_at = time.perf_counter() - origin
            coord_pid, me = fleet.coordinator.pid, os.getpid()
            cpu_at_burst = (process_cpu_s(me), process_cpu_s(coord_pid))

            async def one(body: dict[str, Any], priority: int) -> Sent:
                started = time.perf_counter() - origin
                try:
                    answer = await asyncio.wait_for(
                        send_stream(
                            host, port, body, {PRIORITY_HEADER: str(priority)}, read_refusal=True
                        ),
                        load.request_timeout_s,
                    )
                except TimeoutError:  # a starved coordinator: counted, not the run's end
                    answer = Answer(
                        error=f"no whole answer within {load.request_timeout_s:g} s",
                        total_s=time.perf_counter() - origin - started,
                    )
                return Sent(priority, started, answer)

            burst = zip(bodies, priorities, strict=True)
            sent = await asyncio.gather(*(one(b, p) for b, p in burst))
            burst_end = max(s.start_s + s.answer.total_s for s in sent)
            cpu_at_end = (process_cpu_s(me), process_cpu_s(coord_pid))
            await asyncio.sleep(timeline.settle_s)
            results, view, rejected = await stop_and_drain(
                steady, admin, fleet.url, poller, timeline
            )
        rss_peak = rss_peak_mib(fleet.coordinator.pid)
    finally:
        fleet.close()
    classes = {class_name(settings.steady_priority): steady_figures(results)}
    for priority in dict.fromkeys(settings.burst_priorities):
        classes[class_name(priority)] = burst_figures([s for s in sent if s.priority == priority])
    ok = sum(c["ok"] for c in classes.values())
    total = len(results) + len(sent)
    return {
        "scenario": NAME,
        "description": f"a burst of {size} streamed requests (priorities "
        f"{list(settings.burst_priorities)}) while {load.concurrency} steady clients "
        f"(priority {settings.steady_priority}) run; max_concurrent_requests {limit}, "
        f"queue {load.concurrency}, max_wait_s {settings.max_wait_s:g}",
        **no_fault_row(),
        "sent": total,
        "succeeded": ok,
        "failed_before_first_byte": total - ok,  # shed included: see `classes`
        "classes": classes,
        "steady": steady_windows(results, burst_at, burst_end),
        "steady_bins": steady_bins(results, burst_at),
        "burst_at_s": round(burst_at, 3),
        "burst_end_s": round(burst_end, 3),
        "queue": {
            "max_queued": seen.get("requests_queued"),
            "max_in_flight": seen.get("requests_in_flight"),
            "queued_after": view.get("requests_queued"),
            "in_flight_after": view.get("requests_in_flight"),
        },
        "head_shed_max_lag_s": fleet_settings.head_shed_max_lag_s,
        "head_shed_max_pending": fleet_settings.head_shed_max_pending,
        "loop_lag_s_max_polled": seen.get("loop_lag_s"),
        "coordinator_rss_mib": {"idle_peak": rss_idle, "peak": rss_peak},
        "coordinator_rejected": rejected,
        "cpu_during_burst": {
            "bench_client": _share((cpu_at_burst[0], cpu_at_end[0]), burst_end - burst_at),
            "coordinator": _share((cpu_at_burst[1], cpu_at_end[1]), burst_end - burst_at),
        },
        "token_load_zero": load_is_zero(view),
        "token_load_after": token_load_left(view),
        "errors": [e for c in classes.values() for e in c["errors"]][:5],
        "loadavg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }
