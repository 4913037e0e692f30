"""The legs' connection cap per engine (`pdorch/app/upstream.py`, `leg_client.py`): never more
than `per_replica` connections open to one engine, and legs past it wait for a free connection
instead of failing; on both leg clients."""

from __future__ import annotations

import asyncio

import pytest

from pdorch.app.leg_client import NativeLegClient
from pdorch.app.legs import LegSession, decode_whole
from pdorch.app.upstream import DEFAULT_CONNECTIONS_PER_REPLICA, new_upstream_session
from pdorch.config.fleet import CoordinatorSettings
from tests.coordinator.helpers import LEG_CLIENTS
from tests.waiting import async_wait_until

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class HeldEngine:
    """A real HTTP/1.1 server on a free port that answers each request only when `gate` is
    set, and counts the connections open at once."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.open = 0
        self.most_open = 0
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                self.requests += 1
                await self.gate.wait()
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


@pytest.mark.parametrize("leg_client", LEG_CLIENTS)
async def test_legs_past_the_cap_queue_and_all_succeed(leg_client: str) -> None:
    engine = HeldEngine()
    server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    session: LegSession
    if leg_client == "native":
        session = NativeLegClient(5.0, per_replica=2)
    else:
        session = new_upstream_session(5.0, per_replica=2)
    url = f"http://127.0.0.1:{port}/v1/completions"
    try:
        legs = [
            asyncio.ensure_future(decode_whole(session, url, b"{}", {"x-request-id": str(i)}))
            for i in range(6)
        ]

        async def two_held() -> bool:
            return engine.requests == 2

        await async_wait_until(two_held, 10, message="two legs at the engine")
        # the other four wait for a connection (none failed, none reached the engine)
        assert engine.open == 2
        assert not any(leg.done() for leg in legs)
        engine.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(*legs), 10)
        assert [content for content, _ in answers] == [b"{}"] * 6
        assert engine.requests == 6
        assert engine.most_open == 2  # the cap held: the queued legs reused the two
    finally:
        await session.close()
        server.close()
        await server.wait_closed()


async def test_default_cap_is_vllms_largest_default_batch() -> None:
    assert CoordinatorSettings().upstream_connections_per_replica == 1024
    assert DEFAULT_CONNECTIONS_PER_REPLICA == 1024
    session = new_upstream_session(5.0, CoordinatorSettings().upstream_connections_per_replica)
    probes = new_upstream_session(5.0, 0)
    try:
        assert session.connector is not None and session.connector.limit_per_host == 1024
        assert probes.connector is not None and probes.connector.limit_per_host == 0
    finally:
        await session.close()
        await probes.close()
