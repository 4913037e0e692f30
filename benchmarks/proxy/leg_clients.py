"""Client CPU per upstream leg: httpx vs the coordinator's aiohttp session, one simulated engine.

    python -m benchmarks.proxy.leg_clients [--requests 1500] [--concurrency 1]

Starts one `pdorch engine sim` (tiny profile, engine answers at once), then POSTs the same
one-token completion `requests` times from `concurrency` tasks with each client, twice in
turn, and prints this process's CPU µs per request (`time.process_time`), which is what
an upstream leg costs the coordinator. `aiohttp (stream timeouts)` is the session with the
read timer that streamed decode legs use (`pdorch/app/upstream.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import msgspec

from benchmarks.proxy.processes import start_sim, stop_process
from pdorch.app.upstream import new_upstream_session, stream_timeout
from pools.http_client import client_limits, http_client
from pools.ports import free_port

_encode = msgspec.json.Encoder().encode
MODEL = "bench-model"


async def _measure(
    name: str, one: Callable[[int], Awaitable[None]], requests: int, concurrency: int
) -> None:
    for i in range(50):  # warm-up: connections open, caches filled
        await one(i)
    counter = itertools.count()

    async def worker() -> None:
        while (i := next(counter)) < requests:
            await one(i)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(f"{name:28s} {cpu / requests * 1e6:8.1f} µs CPU/req {requests / wall:8.0f} req/s")


async def main(requests: int, concurrency: int) -> None:
    log_dir = Path(tempfile.mkdtemp(prefix="pdorch-leg-clients-"))
    sim = await start_sim(
        "prefill",
        log_dir,
        time_scale=0.0001,
        model_profile="tiny",
        served_model_name=MODEL,
        kv_events_port=free_port(),
    )
    url = sim.url + "/v1/completions"

    def body(i: int) -> bytes:
        return _encode({"model": MODEL, "prompt": f"{i} say something short", "max_tokens": 1})

    def headers() -> dict[str, str]:
        return {"X-Request-Id": uuid.uuid4().hex, "content-type": "application/json"}

    limits = client_limits(max_connections=None, max_keepalive_connections=1024)
    http = http_client(limits=limits, timeout=httpx.Timeout(30.0, connect=5.0))
    session = new_upstream_session(5.0)
    streamed = stream_timeout(5.0, 30.0)

    async def with_httpx(i: int) -> None:
        (await http.post(url, content=body(i), headers=headers())).raise_for_status()

    async def with_aiohttp(i: int) -> None:
        async with session.post(url, data=body(i), headers=headers()) as response:
            await response.read()

    async def with_aiohttp_stream_timeouts(i: int) -> None:
        async with session.post(url, data=body(i), headers=headers(), timeout=streamed) as response:
            await response.read()

    try:
        for _ in range(2):
            await _measure("httpx (before)", with_httpx, requests, concurrency)
            await _measure("aiohttp (upstream.py)", with_aiohttp, requests, concurrency)
            await _measure(
                "aiohttp (stream timeouts)", with_aiohttp_stream_timeouts, requests, concurrency
            )
    finally:
        await http.aclose()
        await session.close()
        stop_process(sim)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.concurrency))
