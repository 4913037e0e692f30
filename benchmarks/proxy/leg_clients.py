"""Client CPU per upstream leg: the coordinator's two leg clients side by side, one sim engine.

    python -m benchmarks.proxy.leg_clients [--requests 1500] [--concurrency 1,32] [--rounds 5]
        [--stream-tokens 0] [--out FILE.json]

Starts one `pdorch engine sim` (tiny profile, answers at once), then per concurrency C runs
`rounds` rounds; in each round every client (`coordinator.leg_client`: `aiohttp`,
`pdorch/app/upstream.py`, and `native`, `pdorch/app/leg_client.py`) sends the same one-token
completion `requests` times from C tasks, the clients in turn (so a load swing on the box
hits both). Each leg runs through `pdorch/app/legs.py` (`decode_whole`; with
`--stream-tokens N`, `open_decode_stream` of an N-token SSE answer read to its end), exactly
what the coordinator runs per leg. Reported per client and C: this process's CPU µs per leg
(`time.process_time`), the minimum over the rounds (the least-disturbed round on a shared
box), and legs/s of that round; plus native / aiohttp ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from benchmarks.proxy.processes import start_sim, stop_process
from pdorch.app.leg_client import NativeLegClient
from pdorch.app.legs import LegSession, decode_whole, open_decode_stream
from pdorch.app.upstream import new_upstream_session
from pools.ports import free_port

_encode = msgspec.json.Encoder().encode
MODEL = "bench-model"
CLIENTS = ("aiohttp", "native")


async def _round(
    one: Callable[[int], Awaitable[None]], requests: int, concurrency: int
) -> tuple[float, float]:
    """(CPU µs per leg, legs/s) of `requests` legs from `concurrency` tasks."""
    counter = itertools.count()

    async def worker() -> None:
        while (i := next(counter)) < requests:
            await one(i)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return cpu / requests * 1e6, requests / wall


async def main(
    requests: int, concurrencies: list[int], rounds: int, stream_tokens: int
) -> dict[str, Any]:
    log_dir = Path(tempfile.mkdtemp(prefix="pdorch-leg-clients-"))
    sim = await start_sim(
        "decode",
        log_dir,
        time_scale=0.0001,
        model_profile="tiny",
        served_model_name=MODEL,
        kv_events_port=free_port(),
    )
    url = sim.url + "/v1/completions"
    stream = stream_tokens > 0
    max_tokens = stream_tokens if stream else 1

    def body(i: int) -> bytes:
        return _encode(
            {
                "model": MODEL,
                "prompt": f"{i} say something short",
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": stream,
            }
        )

    sessions: dict[str, LegSession] = {
        "aiohttp": new_upstream_session(5.0),
        "native": NativeLegClient(5.0),
    }

    def leg(session: LegSession) -> Callable[[int], Awaitable[None]]:
        async def one(i: int) -> None:
            headers = {"X-Request-Id": uuid.uuid4().hex, "content-type": "application/json"}
            if not stream:
                await decode_whole(session, url, body(i), headers)
                return
            opened = await open_decode_stream(session, url, body(i), headers)
            try:
                async for _ in opened.rest:
                    pass
            finally:
                await opened.aclose()

        return one

    results: dict[str, Any] = {
        "requests": requests,
        "rounds": rounds,
        "stream_tokens": stream_tokens,
        "load_avg_before": os.getloadavg()[0],
        "rows": [],
    }
    try:
        for concurrency in concurrencies:
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in CLIENTS}
            for name in CLIENTS:  # warm-up: connections open, caches filled
                await _round(leg(sessions[name]), 50, concurrency)
            for _ in range(rounds):
                for name in CLIENTS:
                    runs[name].append(await _round(leg(sessions[name]), requests, concurrency))
            best = {name: min(runs[name]) for name in CLIENTS}
            for name in CLIENTS:
                cpu, rate = best[name]
                print(
                    f"C={concurrency:<4d} {name:8s} {cpu:8.1f} µs CPU/leg (min of {rounds}) "
                    f"{rate:8.0f} legs/s   all: {[(round(c), round(r)) for c, r in runs[name]]}"
                )
                results["rows"].append(
                    {
                        "client": name,
                        "concurrency": concurrency,
                        "cpu_us_per_leg_min": round(cpu, 1),
                        "legs_per_s_of_min_round": round(rate, 1),
                        "cpu_us_per_leg_rounds": [round(c, 1) for c, _ in runs[name]],
                    }
                )
            ratio = best["native"][0] / best["aiohttp"][0]
            print(f"C={concurrency:<4d} native / aiohttp CPU per leg: {ratio:.2f}")
    finally:
        for session in sessions.values():
            await session.close()
        stop_process(sim)
    results["load_avg_after"] = os.getloadavg()[0]
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--concurrency", default="1,32", help="comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stream-tokens", type=int, default=0, help="0: whole answers")
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the results")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()  # `pdorch serve` runs on uvloop
    except ImportError:
        pass
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    result = asyncio.run(main(args.requests, concurrencies, args.rounds, args.stream_tokens))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
