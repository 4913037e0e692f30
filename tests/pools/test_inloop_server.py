"""`pools.inloop_server.InLoopHttpServer`: real uvicorn on the test's loop, real HTTP clients."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from pools.http_client import http_client
from pools.inloop_server import InLoopHttpServer


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, str]:
        return {"pong": "yes"}

    @app.get("/forever")
    async def forever() -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            while True:
                yield b"tick\n"
                await asyncio.sleep(0.05)

        return StreamingResponse(body(), media_type="text/plain")

    return app


async def test_port_zero_is_bound_and_known_after_start() -> None:
    async with InLoopHttpServer(_app(), port=0) as a, InLoopHttpServer(_app(), port=0) as b:
        assert a.port and b.port and a.port != b.port
        assert a.url == f"http://127.0.0.1:{a.port}"
        async with http_client(trust_env=False) as client:
            for server in (a, b):
                r = await client.get(f"{server.url}/ping")
                assert r.json() == {"pong": "yes"}
    assert not a.serving and not b.serving


async def test_a_taken_port_fails_start_and_leaves_nothing_running() -> None:
    async with InLoopHttpServer(_app(), port=0) as first:
        assert first.port is not None
        second = InLoopHttpServer(_app(), port=first.port)
        with pytest.raises(OSError):
            await second.start()
        assert not second.serving and second.url is None
        await second.stop()  # idempotent after a failed start
        async with http_client(trust_env=False) as client:
            assert (await client.get(f"{first.url}/ping")).status_code == 200


async def test_stop_ends_an_endless_stream_within_the_deadline() -> None:
    server = InLoopHttpServer(_app(), port=0, graceful_shutdown_s=1, stop_deadline_s=3.0)
    url = await server.start()
    got_first = asyncio.Event()

    async def read_stream() -> int:
        lines = 0
        async with (
            http_client(trust_env=False, timeout=10.0) as client,
            client.stream("GET", f"{url}/forever") as r,
        ):
            try:
                async for _ in r.aiter_lines():
                    lines += 1
                    got_first.set()
            except httpx.HTTPError:
                pass  # the server cut the stream: what stop() promises
        return lines

    reader = asyncio.get_running_loop().create_task(read_stream())
    await asyncio.wait_for(got_first.wait(), 10.0)
    began = time.monotonic()
    await server.stop()
    took = time.monotonic() - began
    assert took < 3.0 + 0.5
    assert await asyncio.wait_for(reader, 5.0) >= 1
    assert not server.serving
    with pytest.raises(httpx.ConnectError):
        async with http_client(trust_env=False) as client:
            await client.get(f"{url}/ping")
    await server.stop()  # idempotent
