"""The health checker against real local HTTP servers: a stopped engine leaves routing within
1 s and comes back once it serves again; a hung one is ejected by the probe timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from pools.fleet import Fleet, FleetEvent, ReplicaHealthChanged
from pools.health import HealthChecker, HealthSettings
from pools.http_client import http_client
from pools.replica import ReplicaEndpoint, ReplicaState
from pools.sim.server import SimServer
from pools.sim.settings import SimEngineSettings
from tests.waiting import async_wait_until


def sim_settings(port: int = 0) -> SimEngineSettings:
    return SimEngineSettings.model_validate(
        {
            "port": port,
            "time_scale": 0.01,
            "num_blocks": 64,
            "max_model_len": 512,
            "kv_transport": "none",
        }
    )


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with http_client() as c:
        yield c


async def test_stopped_engine_leaves_routing_within_1s_and_comes_back(
    client: httpx.AsyncClient,
) -> None:
    server = SimServer(sim_settings())
    url = await server.start()
    other = SimServer(sim_settings())
    other_url = await other.start()
    try:
        fleet = Fleet()
        changes: list[ReplicaHealthChanged] = []

        def on_event(event: FleetEvent) -> None:
            if isinstance(event, ReplicaHealthChanged):
                changes.append(event)

        fleet.subscribe(on_event)
        fleet.add_replica(ReplicaEndpoint("decode-0", "decode", url, "tiny", 16), 0.0)
        fleet.add_replica(ReplicaEndpoint("decode-1", "decode", other_url, "tiny", 16), 0.0)
        settings = HealthSettings()
        async with HealthChecker.from_config(fleet, client, settings) as checker:

            async def two_rounds() -> bool:
                return checker.rounds >= 2

            await async_wait_until(two_rounds, timeout=5.0, message="two probe rounds")
            assert [r.replica_id for r in fleet.routable("decode")] == ["decode-0", "decode-1"]

            await server.stop()
            stopped_at = time.monotonic()
            await async_wait_until(
                routable_is(fleet, "decode-0", False),
                timeout=1.0,
                interval=0.01,
                message="decode-0 ejected",
            )
            assert time.monotonic() - stopped_at < 1.0
            assert [r.replica_id for r in fleet.routable("decode")] == ["decode-1"]
            assert changes[-1].new is ReplicaState.UNHEALTHY

            server = SimServer(sim_settings(port_of(url)))  # same address, a fresh engine
            await server.start()
            await async_wait_until(
                routable_is(fleet, "decode-0", True),
                timeout=2.0,
                message="decode-0 back",
            )
            assert last_state(changes) is ReplicaState.HEALTHY
    finally:
        await server.stop()
        await other.stop()


class FakeHungEngine:
    """A TCP server that accepts connections and never answers (no real engine hangs on
    demand): the probe must time out instead of waiting forever."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._writers.append(writer)

        self._server = await asyncio.start_server(accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def test_hung_engine_is_ejected_by_the_probe_timeout(client: httpx.AsyncClient) -> None:
    hung = FakeHungEngine()
    url = await hung.start()
    try:
        fleet = Fleet()
        fleet.add_replica(ReplicaEndpoint("prefill-0", "prefill", url, "tiny", 16), 0.0)
        started = time.monotonic()
        async with HealthChecker(fleet, client, interval_s=0.25, timeout_s=0.5):
            await async_wait_until(
                routable_is(fleet, "prefill-0", False),
                timeout=3.0,  # issue 14's budget for a hung engine
                message="hung replica ejected",
            )
        # two probes in a row had to time out (`probe_timeouts_to_eject`), not one
        assert 2 * 0.5 <= time.monotonic() - started < 3.0
        replica = fleet.get("prefill-0")
        assert replica is not None and replica.last_error is not None
        assert replica.last_error.startswith("timeout")
    finally:
        await hung.stop()


async def test_check_once_marks_a_refused_port_unhealthy(client: httpx.AsyncClient) -> None:
    fleet = Fleet()
    fleet.add_replica(ReplicaEndpoint("d", "decode", "http://127.0.0.1:9", "m", 16), 0.0)
    await HealthChecker(fleet, client).check_once()
    replica = fleet.get("d")
    assert replica is not None and replica.state is ReplicaState.UNHEALTHY
    assert replica.last_error is not None and replica.last_error.startswith("connection")


def last_state(changes: list[ReplicaHealthChanged]) -> ReplicaState:
    return changes[-1].new


def routable_is(fleet: Fleet, replica_id: str, expected: bool) -> Callable[[], Awaitable[bool]]:
    """A condition for `async_wait_until`: the replica's routability equals `expected`."""

    async def condition() -> bool:
        replica = fleet.get(replica_id)
        return replica is not None and replica.routable == expected

    return condition
