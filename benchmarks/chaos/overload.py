"""The `overload` chaos scenario: a burst of `burst_factor` x what the fleet is set to serve,
against the coordinator's bounded admission (pdorch/app/admission.py).

The fleet (2P+2D, as the other scenarios) runs with `coordinator.max_concurrent_requests` =
the load's `concurrency` (32: what the steady scenarios serve), `admission.max_queue` =
`concurrency` and `admission.max_wait_s` = `max_wait_s` (2 s). Then `burst_factor x
concurrency` (10 x 32 = 320) streamed completions start at once. Figures: `sent`, `succeeded`,
`shed` (429 with `Retry-After`), `other_errors` (anything else: must be 0; a 5xx among them
would be the coordinator failing under load), shed latency (send → 429) p50/p99/max, admitted
TTFT p50/p99 (send → first byte, queue wait included), and the coordinator process's RSS peak
(`VmHWM` of /proc/PID/status: the high-water mark over its whole life).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks.chaos.fleet import ChaosFleet, FleetSettings
from benchmarks.chaos.load import LoadSettings, payload
from benchmarks.chaos.scenarios import load_is_zero
from pools.http_client import http_client


@dataclass(frozen=True, slots=True)
class OverloadSettings:
    burst_factor: int = 10
    max_wait_s: float = 2.0
    request_timeout_s: float = 120.0


@dataclass(slots=True)
class Answer:
    status: int | None = None
    retry_after: str | None = None
    first_byte_s: float | None = None
    total_s: float = 0.0
    error: str | None = None
    body: bytes = b""  # a refusal's body (only with `read_refusal`)


async def send_stream(
    host: str,
    port: int,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    *,
    read_refusal: bool = False,
) -> Answer:
    """One streamed completion over a bare asyncio connection (HTTP/1.1, `Connection: close`).

    Not httpx: 320 httpx streams at once cost the bench client seconds of CPU on a 2-core box,
    and that time would be counted as the coordinator's shed latency. First byte = the first
    read holding an SSE `data:` event; the answer ends at EOF. A refusal (not 200) ends at its
    head (`total_s`); `read_refusal` also reads its body to EOF into `body` (`total_s` stays
    the head's time)."""
    answer = Answer()
    data = json.dumps(body).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(data)}\r\n{extra}"
        "connection: close\r\n\r\n"
    ).encode()
    started = time.perf_counter()
    writer: asyncio.StreamWriter | None = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(head + data)
        await writer.drain()
        received = b""
        while chunk := await reader.read(65536):
            if answer.first_byte_s is None and b"data: " in chunk:
                answer.first_byte_s = time.perf_counter() - started
            if answer.status is not None:
                received = (received + chunk)[-64:]  # the tail, for [DONE]
                continue
            received += chunk
            if b"\r\n\r\n" in received:
                answer.status, answer.retry_after = _status(received)
                if answer.status != 200:
                    answer.total_s = time.perf_counter() - started
                    if read_refusal:
                        rest = await reader.read()
                        answer.body = received.split(b"\r\n\r\n", 1)[1] + rest
                    break  # a refusal: its status is all we need
        if answer.status == 200 and b"[DONE]" not in received:
            answer.error = "stream ended before [DONE]"
    except OSError as err:
        answer.error = f"{type(err).__name__}: {err}"
    finally:
        if writer is not None:
            writer.close()
    if answer.status is None or answer.status == 200:
        answer.total_s = time.perf_counter() - started
    return answer


def _status(received: bytes) -> tuple[int, str | None]:
    """The status code and Retry-After of a response head."""
    lines = received.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    retry_after = None
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "retry-after":
            retry_after = value.strip()
    return int(lines[0].split()[1]), retry_after


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


def rss_peak_mib(pid: int) -> float | None:
    """The process's resident-set high-water mark (VmHWM), MiB; None off Linux."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


async def run_overload(
    fleet_settings: FleetSettings,
    load: LoadSettings,
    settings: OverloadSettings,
    log_dir: Path,
) -> dict[str, Any]:
    """The scenario on a fresh fleet; its JSON row (same outcome keys as the others)."""
    capacity = load.concurrency
    fleet = ChaosFleet(
        replace(
            fleet_settings,
            max_concurrent_requests=capacity,
            max_queue=capacity,
            max_wait_s=settings.max_wait_s,
        ),
        log_dir,
    )
    burst = settings.burst_factor * capacity
    load_before = os.getloadavg()
    try:
        await fleet.start()
        assert fleet.coordinator is not None
        rss_idle = rss_peak_mib(fleet.coordinator.pid)
        host, port = urlsplit(fleet.url).hostname or "127.0.0.1", urlsplit(fleet.url).port or 80
        model = fleet_settings.served_model_name
        bodies = [payload(model, load, stream=True) for _ in range(burst)]  # built before timing
        async with asyncio.timeout(settings.request_timeout_s):
            answers = await asyncio.gather(*(send_stream(host, port, body) for body in bodies))
        async with http_client(timeout=10.0) as client:
            view = (await client.get(fleet.url + "/admin/pools")).json()
        rss_peak = rss_peak_mib(fleet.coordinator.pid)
    finally:
        fleet.close()
    ok = [a for a in answers if a.status == 200 and a.error is None]
    shed = [a for a in answers if a.status == 429]
    other = [a for a in answers if a not in ok and a not in shed]
    return {
        "scenario": "overload",
        "description": f"a burst of {burst} streamed requests ({settings.burst_factor}x "
        f"max_concurrent_requests {capacity}; queue {capacity}, max_wait_s "
        f"{settings.max_wait_s:g})",
        "replicas": [],
        "sent": len(answers),
        "succeeded": len(ok),
        "shed": len(shed),
        "shed_with_retry_after": sum(1 for a in shed if a.retry_after),
        "other_errors": len(other),
        "server_errors_5xx": sum(1 for a in other if a.status is not None and a.status >= 500),
        "failed_before_first_byte": len(other),
        "broken_mid_stream": 0,
        "hung": 0,
        "by_kind": {"stream": {"hung": 0}, "whole": {"hung": 0}},
        "shed_latency_s": {
            "p50": quantile([a.total_s for a in shed], 0.5),
            "p99": quantile([a.total_s for a in shed], 0.99),
            "max": quantile([a.total_s for a in shed], 1.0),
        },
        "admitted_ttft_s": {
            "p50": quantile([a.first_byte_s for a in ok if a.first_byte_s is not None], 0.5),
            "p99": quantile([a.first_byte_s for a in ok if a.first_byte_s is not None], 0.99),
        },
        "coordinator_rss_mib": {"idle_peak": rss_idle, "peak": rss_peak},
        "routing": {},
        "token_load_zero": load_is_zero(view),  # read once, right after the last answer
        "requests_queued_after": view.get("requests_queued"),
        "errors": sorted({a.error or f"HTTP {a.status}" for a in other})[:5],
        "loadavg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }
