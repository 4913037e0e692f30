"""The native leg client (`pdorch/app/leg_client.py`) against a tiny real HTTP/1.1 server whose
every answer is scripted: chunked and content-length bodies, keep-alive reuse, `connection:
close`, a close / reset / half-close mid-answer, refused connects, 4xx/5xx, the per-leg
deadline, and an answer closed early. Through `legs.py`, so the failures are the kinds the
flow acts on."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import pytest

from pdorch.app.leg_client import LegDeadline, LegDisconnected, NativeLegClient
from pdorch.app.legs import LegFailure, UpstreamAnswer, decode_whole, open_decode_stream
from pdorch.config.fleet import FleetConfigError
from pools.fleet import FailureKind
from tests.coordinator.helpers import fleet
from tests.ports import free_port
from tests.waiting import async_wait_until

Script = Callable[[asyncio.StreamWriter, int], Awaitable[None]]
Held = Callable[[], Awaitable[None]]
HEADERS = {"x-request-id": "leg-1", "content-type": "application/json"}


class ScriptedEngine:
    """Reads each request (head + content-length body) and runs `script(writer, n)` for the
    n-th request over all connections; counts connections and sees them close."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests = 0
        self.connections = 0
        self.closed = 0  # connections the client closed (EOF while waiting or writing)
        self.bodies: list[bytes] = []
        self.handlers: set[asyncio.Task[None]] = set()
        self.hold: Held = _forever  # a script's "never answer": returns when the client closes

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                self.bodies.append(await reader.readexactly(length))
                self.requests += 1
                self.hold = partial(_until_closed, reader)
                await self.script(writer, self.requests)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed += 1
        except asyncio.CancelledError:  # the test ended with this answer still held
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        """Let each connection's handler see its close, then end the ones still holding."""
        if self.handlers:
            _, held = await asyncio.wait(self.handlers, timeout=2)
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)


async def _forever() -> None:
    await asyncio.Event().wait()


async def _until_closed(reader: asyncio.StreamReader) -> None:
    """Hold the answer until the client closes the connection (as an engine notices it)."""
    if not await reader.read(1):
        raise ConnectionResetError("the client closed the connection")


@asynccontextmanager
async def engine(script: Script) -> AsyncIterator[tuple[ScriptedEngine, str]]:
    scripted = ScriptedEngine(script)
    server = await asyncio.start_server(scripted.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield scripted, f"http://127.0.0.1:{port}/v1/completions"
    finally:
        await scripted.stop()
        server.close()
        await server.wait_closed()


@asynccontextmanager
async def native(per_replica: int = 1024) -> AsyncIterator[NativeLegClient]:
    client = NativeLegClient(2.0, per_replica)
    try:
        yield client
    finally:
        await client.close()


def whole(body: bytes, status: str = "200 OK", extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n" % len(body) + extra + b"\r\n" + body
    )


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


async def test_content_length_answers_reuse_one_keep_alive_connection() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(whole(b'{"n":%d}' % n))

    async with engine(answer) as (scripted, url), native() as client:
        for n in range(1, 4):
            content, ctype = await decode_whole(client, url, b'{"a":1}', HEADERS)
            assert content == b'{"n":%d}' % n and ctype == "application/json"
        assert scripted.connections == 1  # every leg reused the first connection
        assert scripted.bodies == [b'{"a":1}'] * 3
        assert client.connections(url) == (1, 1)


async def test_chunked_stream_is_delivered_as_read_and_the_connection_reused() -> None:
    events = [b'data: {"t":%d}\n\n' % i for i in range(4)]
    go = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(SSE_HEAD + chunk(events[0]))
        await go.wait()
        writer.write(chunk(events[1]) + chunk(events[2]))  # two chunks, one read
        await writer.drain()
        writer.write(chunk(events[3]) + b"0\r\n\r\n")

    async with engine(answer) as (scripted, url), native() as client:
        stream = await open_decode_stream(client, url, b"{}", HEADERS)
        assert stream.first == events[0]  # the first read: the first event alone
        go.set()
        rest = [piece async for piece in stream.rest]
        # de-chunked, never re-split: each read's bytes as one piece
        assert b"".join(rest) == b"".join(events[1:])
        assert rest[0].startswith(events[1] + events[2])
        await stream.aclose()
        again = await open_decode_stream(client, url, b"{}", HEADERS)
        assert again.first + b"".join([p async for p in again.rest]) == b"".join(events)
        await again.aclose()
        assert scripted.connections == 1


async def test_connection_close_answer_is_not_reused() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(whole(b"{}", extra=b"connection: close\r\n"))
        await writer.drain()
        writer.close()

    async with engine(answer) as (scripted, url), native() as client:
        for _ in range(2):
            assert (await decode_whole(client, url, b"{}", HEADERS))[0] == b"{}"
        assert scripted.connections == 2


async def test_body_without_length_ends_at_the_close() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"a":')
        await writer.drain()
        writer.write(b"1}")
        await writer.drain()
        writer.close()

    async with engine(answer) as (_, url), native() as client:
        assert await decode_whole(client, url, b"{}", HEADERS) == (b'{"a":1}', "application/json")


async def test_close_mid_body_is_a_connection_failure_the_engine_got() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"partial')
        await writer.drain()
        writer.close()

    async with engine(answer) as (_, url), native() as client:
        with pytest.raises(LegFailure) as failed:
            await decode_whole(client, url, b"{}", HEADERS)
        assert failed.value.kind is FailureKind.CONNECTION
        assert failed.value.reached and failed.value.status == 0  # mid-answer: migratable


async def test_reset_mid_stream_ends_the_read_with_a_connection_error() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(SSE_HEAD + chunk(b"data: {}\n\n"))
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST

    async with engine(answer) as (_, url), native() as client:
        stream = await open_decode_stream(client, url, b"{}", HEADERS)
        with pytest.raises(LegDisconnected):
            async for _ in stream.rest:
                pass
        await stream.aclose()
        assert client.connections(url) == (0, 0)


async def test_half_close_before_the_answer_is_a_connection_failure() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write_eof()  # our write side shut, no answer

    async with engine(answer) as (_, url), native() as client:
        with pytest.raises(LegFailure) as failed:
            await decode_whole(client, url, b"{}", HEADERS)
        assert failed.value.kind is FailureKind.CONNECTION and failed.value.reached


async def test_refused_connect_is_a_connection_failure_never_reached() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1/completions"
    async with native() as client:
        with pytest.raises(LegFailure) as failed:
            await decode_whole(client, url, b"{}", HEADERS)
        assert failed.value.kind is FailureKind.CONNECTION and not failed.value.reached


async def test_5xx_is_an_engine_failure_4xx_passes_through_and_both_keep_the_connection() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        status = "503 Service Unavailable" if n == 1 else "400 Bad Request"
        writer.write(whole(b'{"error":"x"}', status=status))

    async with engine(answer) as (scripted, url), native() as client:
        with pytest.raises(LegFailure) as failed:
            await open_decode_stream(client, url, b"{}", HEADERS)
        assert failed.value.kind is FailureKind.HTTP_5XX and failed.value.status == 503
        with pytest.raises(UpstreamAnswer) as passed:
            await decode_whole(client, url, b"{}", HEADERS)
        assert passed.value.status == 400 and passed.value.content == b'{"error":"x"}'
        assert scripted.connections == 1  # both answers were read whole: reused


async def test_answer_closed_early_closes_the_connection_so_the_engine_aborts() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(SSE_HEAD + chunk(b"data: {}\n\n"))
        await writer.drain()
        await scripted.hold()  # never ends the stream

    async with engine(answer) as (scripted, url), native() as client:
        stream = await open_decode_stream(client, url, b"{}", HEADERS)
        stream.close()  # the stall watchdog's / a drain cut's close
        with pytest.raises(LegDisconnected):
            await anext(stream.rest)
        await stream.aclose()

        async def engine_saw_it() -> bool:
            return scripted.closed == 1

        await async_wait_until(engine_saw_it, 5, message="the engine sees the close")
        assert client.connections(url) == (0, 0)  # never back in the pool


async def test_cancelled_leg_closes_its_connection() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        await scripted.hold()  # no answer at all

    async with engine(answer) as (scripted, url), native() as client:
        leg = asyncio.ensure_future(decode_whole(client, url, b"{}", HEADERS))

        async def sent() -> bool:
            return scripted.requests == 1

        await async_wait_until(sent, 5, message="the leg reached the engine")
        leg.cancel()  # the client left
        with pytest.raises(asyncio.CancelledError):
            await leg

        async def closed() -> bool:
            return scripted.closed == 1

        await async_wait_until(closed, 5, message="the engine sees the close")


async def test_deadline_is_a_timeout_of_the_whole_leg() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(SSE_HEAD + chunk(b"data: {}\n\n"))
        await writer.drain()
        await asyncio.Event().wait()

    async with engine(answer) as (_, url), native() as client:
        response = await client.post(url, b"{}", HEADERS, deadline_s=0.2)
        assert await anext(response) == b"data: {}\n\n"
        with pytest.raises(LegDeadline) as expired:
            await asyncio.wait_for(anext(response), 5)
        assert isinstance(expired.value, TimeoutError)


async def test_legs_past_the_cap_queue_and_a_cancelled_waiter_gives_its_turn_on() -> None:
    gate = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        await gate.wait()
        writer.write(whole(b"{}"))

    async with engine(answer) as (scripted, url), native(per_replica=1) as client:
        legs = [asyncio.ensure_future(decode_whole(client, url, b"{}", HEADERS)) for _ in range(3)]

        async def one_held() -> bool:
            return scripted.requests == 1

        await async_wait_until(one_held, 5, message="one leg at the engine")
        legs[1].cancel()  # a queued leg whose client left: never sent, its turn passes on
        gate.set()
        assert (await asyncio.wait_for(legs[0], 5))[0] == b"{}"
        assert (await asyncio.wait_for(legs[2], 5))[0] == b"{}"
        assert legs[1].cancelled()
        assert scripted.requests == 2 and scripted.connections == 1


async def test_32_concurrent_legs_reach_the_engine_at_once_and_reuse_their_connections() -> None:
    """C=32, the bench's concurrency: each wave's 32 legs are all at the engine at once (the
    engine answers a wave only when all of it is in: a leg queued in the pool below the cap,
    or waiting on anything but the engine, would hang the wave), and later waves reuse the
    same 32 keep-alive connections (no connect per leg). The pool and reuse are not what
    held native back at C=32 in the sequential bench (`benchmarks/results/proxy.md`)."""
    width = 32
    in_flight = peak = 0
    full = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight == width:
            full.set()
        await full.wait()
        in_flight -= 1
        if in_flight == 0:
            full.clear()
        writer.write(whole(b'{"n":%d}' % n))

    async with engine(answer) as (scripted, url), native() as client:
        for wave in range(3):
            legs = [decode_whole(client, url, b"{}", HEADERS) for _ in range(width)]
            try:
                async with asyncio.timeout(10):
                    answers = await asyncio.gather(*legs)
            except TimeoutError:
                pytest.fail(f"wave {wave}: {in_flight} of {width} legs reached the engine")
            assert all(content.startswith(b'{"n":') for content, _ in answers)
        assert peak == width and scripted.requests == 3 * width
        assert scripted.connections == width  # waves 2 and 3 reused wave 1's connections
        assert client.connections(url) == (width, width)


@pytest.mark.unit
def test_leg_client_setting_is_validated_and_named() -> None:
    assert fleet().coordinator.leg_client == "aiohttp"
    assert fleet(coordinator={"leg_client": "native"}).coordinator.leg_client == "native"
    with pytest.raises(FleetConfigError, match=r"coordinator\.leg_client"):
        fleet(coordinator={"leg_client": "curl"})
