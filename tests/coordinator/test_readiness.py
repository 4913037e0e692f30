"""A (re)started coordinator is not ready while its KV-event join replay runs.

Real parts: simulated engine processes (launched by coordinator A, which fills their prefix
caches), real ZMQ, and a second coordinator B over the same engines as static endpoints, as a
restarted coordinator meets a running fleet. B's decode replay socket is reached through a
ZMQ ROUTER/DEALER relay the test holds, so the replay's end is the test's to choose: until it
ends `/health` is 503 `replaying` and B's index holds nothing of the engine's; at the first
200 it holds every block the engine caches. A replay socket that never answers ends in the
subscriber's idle timeout (`replay_timeout_s`): ready then, the replay counted as failed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import zmq
import zmq.asyncio

from pdorch.app.server import RunningCoordinator, run_coordinator
from pdorch.config.fleet import FleetConfig, parse_fleet_config
from pools.http_client import http_client
from pools.replica import ReplicaEndpoint
from router.kv_events import END_OF_REPLAY_SEQ
from tests.coordinator.helpers import MODEL, fleet, long_prompt
from tests.ports import free_port
from tests.waiting import async_wait_until


class HeldReplay:
    """A ROUTER in front of an engine's replay socket: it takes each replay request and, once
    `release` is set, asks the engine (a DEALER) and passes every answer frame back, up to
    the end-of-replay marker. `asked` counts the requests it took."""

    def __init__(self, engine_endpoint: str) -> None:
        self.engine_endpoint = engine_endpoint
        self.release = asyncio.Event()
        self.asked = 0
        self.forwarded = 0
        self._ctx = zmq.asyncio.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.bind("tcp://127.0.0.1:0")
        self.endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            identity, _empty, start = await self._router.recv_multipart()
            self.asked += 1
            await self.release.wait()
            dealer = self._ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(self.engine_endpoint)
            try:
                await dealer.send_multipart([b"", start])
                while True:
                    frames = await dealer.recv_multipart()  # [b"", topic, seq, payload]
                    await self._router.send_multipart([identity, *frames])
                    self.forwarded += 1
                    if frames[2] == END_OF_REPLAY_SEQ:
                        break
            finally:
                dealer.close(linger=0)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._ctx.destroy(linger=0)


def static_copy(a: RunningCoordinator, replay: dict[str, str]) -> FleetConfig:
    """A's fleet as static endpoints (same ids, URLs, KV-event sockets), with the replay
    endpoints in `replay` (replica id → endpoint) put in place of the engines' own."""
    data: dict[str, Any] = {
        "served_model_name": MODEL,
        "block_size": 16,
        "pd": {"min_uncached_tokens": 32},
        "coordinator": {"port": 0},
        "health": {"timeout_s": 2.0},
        "pools": {},
    }
    for pool in ("prefill", "decode"):
        data["pools"][pool] = {
            "endpoints": [
                {
                    "id": e.replica_id,
                    "url": e.url,
                    "kv_events_endpoint": e.kv_events_endpoint,
                    "kv_events_replay_endpoint": replay.get(
                        e.replica_id, e.kv_events_replay_endpoint
                    ),
                    "kv_events_topic": e.kv_events_topic,
                }
                for e in a.fleet.by_pool(pool)
            ]
        }
    return parse_fleet_config(data)


async def health(http: httpx.AsyncClient, url: str) -> tuple[int, str | None]:
    response = await http.get(f"{url}/health")
    if response.status_code == 200:
        return 200, None
    return response.status_code, response.json()["error"]["code"]


async def indexed(http: httpx.AsyncClient, url: str, replica: str) -> int:
    view = (await http.get(f"{url}/admin/pools")).json()
    found = [r for p in view["pools"].values() for r in p["replicas"] if r["id"] == replica]
    return int(found[0]["indexed_blocks"])


async def engine_blocks(http: httpx.AsyncClient, engine_url: str) -> int:
    return int((await http.get(f"{engine_url}/sim/info")).json()["cached_blocks"])


async def fill_decode_cache(
    http: httpx.AsyncClient, a: RunningCoordinator
) -> tuple[ReplicaEndpoint, int]:
    """Fill the engines' prefix caches (and their KV-event buffers) through A; A's decode
    replica and its cached blocks, once A's index holds them all."""
    for _ in range(3):
        body = {"model": MODEL, "prompt": long_prompt(), "max_tokens": 4}
        assert (await http.post(f"{a.url}/v1/completions", json=body)).status_code == 200
    (decode,) = a.fleet.by_pool("decode")

    async def a_has_all() -> int | None:
        n = await engine_blocks(http, decode.url)
        return n if n > 0 and await indexed(http, a.url, decode.replica_id) == n else None

    cached = await async_wait_until(a_has_all, 10.0, message="A's index = the engine's")
    return decode, cached


@dataclass
class HeldJoin:
    """Coordinator B joining behind A, its decode replica's join replay held (`held`)."""

    b: RunningCoordinator
    held: HeldReplay
    decode: ReplicaEndpoint
    cached: int  # the decode engine's cached blocks, all in A's index


@contextlib.asynccontextmanager
async def held_join(http: httpx.AsyncClient, a: RunningCoordinator) -> AsyncIterator[HeldJoin]:
    """Fill A's decode engine's cache (`fill_decode_cache`), then start B over the same
    engines with that engine's replay behind a `HeldReplay` the test releases."""
    decode, cached = await fill_decode_cache(http, a)
    assert decode.kv_events_replay_endpoint is not None
    held = HeldReplay(decode.kv_events_replay_endpoint)
    try:
        async with run_coordinator(static_copy(a, {decode.replica_id: held.endpoint}), port=0) as b:
            yield HeldJoin(b, held, decode, cached)
    finally:
        await held.close()


async def test_health_says_replaying_until_the_join_replay_has_ended() -> None:
    async with run_coordinator(fleet(), port=0) as a, http_client(timeout=30.0) as http:
        async with held_join(http, a) as join:
            b, held, decode, cached = join.b, join.held, join.decode, join.cached
            rid = decode.replica_id

            async def replaying() -> bool:
                return held.asked > 0 and await health(http, b.url) == (503, "replaying")

            # B can route (its replicas start healthy) but its index is empty: not ready
            await async_wait_until(replaying, 10.0, message="503 replaying")
            assert await indexed(http, b.url, rid) == 0
            message = (await http.get(f"{b.url}/health")).json()["error"]["message"]
            assert rid in message
            held.release.set()
            await async_wait_until(
                lambda: _is(health(http, b.url), (200, None)), 10.0, message="ready"
            )
            # at the first 200 the replay has been applied whole
            engine_now = await engine_blocks(http, decode.url)
            assert await indexed(http, b.url, rid) == cached == engine_now
            assert held.forwarded > 0
            counters = (await http.get(f"{b.url}/admin/pools")).json()["kv_events"]
            assert counters["replays_completed"] >= 1 and counters["missed"] == 0

        # a replay socket nobody answers: ready once the replay's idle timeout gives it up
        silent = f"tcp://127.0.0.1:{free_port()}"
        async with run_coordinator(static_copy(a, {rid: silent}), port=0) as c:
            first = await health(http, c.url)
            await async_wait_until(
                lambda: _is(health(http, c.url), (200, None)), 15.0, message="ready"
            )
            counters = (await http.get(f"{c.url}/admin/pools")).json()["kv_events"]
            assert counters["replays_failed"] >= 1, counters
            assert first == (503, "replaying")


async def _is(pending: Any, expected: tuple[int, str | None]) -> bool:
    return bool(await pending == expected)
