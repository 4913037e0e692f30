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
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from benchmarks.chaos.fleet import ChaosFleet, FleetSettings
from benchmarks.chaos.load import LoadSettings, payload
from benchmarks.chaos.scenarios import load_is_zero
from pools.http_client import client_limits, http_client


@dataclass(frozen=True, slots=True)
class OverloadSettings:
    burst_factor: int = 10
    max_wait_s: float = 2.0
    request_timeout_s: float = 120.0


@dataclass(slots=True)
class _Answer:
    status: int | None = None
    retry_after: str | None = None
    first_byte_s: float | None = None
    total_s: float = 0.0
    error: str | None = None


async def _one(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> _Answer:
    answer = _Answer()
    started = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body) as response:
            answer.status = response.status_code
            answer.retry_after = response.headers.get("retry-after")
            tail = b""
            async for chunk in response.aiter_bytes():
                if chunk and answer.first_byte_s is None:
                    answer.first_byte_s = time.perf_counter() - started
                tail = (tail + chunk)[-32:]
            if response.status_code == 200 and b"[DONE]" not in tail:
                answer.error = "stream ended before [DONE]"
    except (httpx.HTTPError, OSError) as err:
        answer.error = f"{type(err).__name__}: {err}"
    answer.total_s = time.perf_counter() - started
    return answer


def _quantile(values: list[float], q: float) -> float | None:
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
        url = fleet.url + "/v1/completions"
        limits = client_limits(max_connections=burst + 8, max_keepalive_connections=burst)
        async with http_client(timeout=settings.request_timeout_s, limits=limits) as client:
            model = fleet_settings.served_model_name
            answers = await asyncio.gather(
                *(_one(client, url, payload(model, load, stream=True)) for _ in range(burst))
            )
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
            "p50": _quantile([a.total_s for a in shed], 0.5),
            "p99": _quantile([a.total_s for a in shed], 0.99),
            "max": _quantile([a.total_s for a in shed], 1.0),
        },
        "admitted_ttft_s": {
            "p50": _quantile([a.first_byte_s for a in ok if a.first_byte_s is not None], 0.5),
            "p99": _quantile([a.first_byte_s for a in ok if a.first_byte_s is not None], 0.99),
        },
        "coordinator_rss_mib": {"idle_peak": rss_idle, "peak": rss_peak},
        "routing": {},
        "token_load_zero": load_is_zero(view),  # read once, right after the last answer
        "requests_queued_after": view.get("requests_queued"),
        "errors": sorted({a.error or f"HTTP {a.status}" for a in other})[:5],
        "loadavg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }
