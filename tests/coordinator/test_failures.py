"""Failure paths: dead or slow engines, clients that leave. Real processes, real HTTP."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest

from pdorch.app.server import RunningCoordinator, run_coordinator
from pools.http_client import http_client
from pools.replica import ReplicaState
from tests.coordinator.helpers import (
    LEG_CLIENTS,
    MODEL,
    RUNNING,
    engine_metric,
    fleet,
    long_prompt,
    sim,
    sse_events,
)
from tests.waiting import async_wait_until


def _state(pd: RunningCoordinator, replica_id: str) -> ReplicaState | None:
    replica = pd.coordinator.fleet.get(replica_id)
    return None if replica is None else replica.state


def _process_pid(pd: RunningCoordinator, index: int) -> int:
    """Pid of the `index`-th engine run as a process (fleet order: pools, then members)."""
    return pd.fleet.pids()[index]


@pytest.mark.parametrize("leg_client", LEG_CLIENTS)
async def test_decode_killed_mid_stream_ends_with_error_event_and_leaves_routing(
    leg_client: str,
) -> None:
    # migration off (test_migration.py has it on): the stream ends with an error event
    config = fleet(
        decode=[sim(2, in_process=False, time_scale=1.0)],
        coordinator={"port": 0, "migration_limit": 0, "leg_client": leg_client},
    )
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        body = {"model": MODEL, "prompt": long_prompt(), "max_tokens": 2000, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200, await response.aread()
            decode = response.headers["x-pdorch-decode"]
            received = b""
            chunks = response.aiter_raw()
            while received.count(b"data: ") < 3:
                received += await anext(chunks)
            killed_at = time.monotonic()
            os.kill(_process_pid(pd, int(decode.rsplit("-", 1)[1])), signal.SIGKILL)
            async for chunk in chunks:
                received += chunk
        took = time.monotonic() - killed_at
        events = sse_events(received.decode())
        assert events[-1] == "[DONE]"
        assert "error" in events[-2], events[-2]
        assert decode in events[-2]["error"]["message"]
        assert took < 5.0
        await async_wait_until(
            _async(lambda: _state(pd, decode) is ReplicaState.UNHEALTHY),
            timeout=max(0.05, 1.0 - (time.monotonic() - killed_at)),
            message=f"{decode} out of routing within 1 s",
        )
        # the next request goes to the other decode replica
        response = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": long_prompt(), "max_tokens": 3}
        )
        assert response.status_code == 200, response.text
        assert response.headers["x-pdorch-decode"] != decode
        view = (await client.get("/admin/pools")).json()
        assert view["tracked_requests"] == 0 and view["requests_in_flight"] == 0


def _async(condition: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return bool(condition())

    return check


@pytest.mark.parametrize("leg_client", LEG_CLIENTS)
async def test_prefill_killed_decode_prefills_locally(leg_client: str) -> None:
    # no health probes: the request path itself must find out
    config = fleet(
        prefill=[sim(in_process=False)],
        health={"interval_s": 60},
        coordinator={"leg_client": leg_client},
    )
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        health = pd.coordinator.health
        assert health is not None
        await async_wait_until(
            _async(lambda: health.rounds >= 1), timeout=5.0, message="first probe round done"
        )
        os.kill(_process_pid(pd, 0), signal.SIGKILL)
        response = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": long_prompt(), "max_tokens": 5}
        )
        assert response.status_code == 200, response.text
        assert response.headers["x-pdorch-route"] == "fallback"
        assert response.headers["x-pdorch-prefill"] == "decode-0"
        assert response.json()["usage"]["completion_tokens"] == 5
        assert _state(pd, "prefill-0") is ReplicaState.UNHEALTHY  # a refused connection ejects
        metrics = (await client.get("/metrics")).text
        assert 'pdorch_prefill_failures_total{kind="connection"} 1.0' in metrics
        # with no healthy prefill replica the decode side prefills without trying
        response = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": long_prompt(), "max_tokens": 5}
        )
        assert response.headers["x-pdorch-route"] == "local"


@pytest.mark.parametrize("leg_client", LEG_CLIENTS)
async def test_decode_dead_before_first_byte_is_retried_on_another_replica(
    leg_client: str,
) -> None:
    # no health probes after the first round: the decode leg itself meets the dead engine
    config = fleet(
        decode=[sim(2, in_process=False)],
        health={"interval_s": 60},
        coordinator={"leg_client": leg_client},
    )
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        health = pd.coordinator.health
        assert health is not None
        await async_wait_until(
            _async(lambda: health.rounds >= 1), timeout=5.0, message="first probe round done"
        )
        explained = await client.post(
            "/admin/explain", json={"model": MODEL, "prompt": long_prompt()}
        )
        first_choice = explained.json()["route"]["decode_replica"]
        os.kill(_process_pid(pd, int(first_choice.rsplit("-", 1)[1])), signal.SIGKILL)
        body = {"model": MODEL, "prompt": long_prompt(), "max_tokens": 5, "stream": True}
        response = await client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        assert response.headers["x-pdorch-decode"] != first_choice
        # the engine never got the request, so the prefill's KV could still be pulled
        assert response.headers["x-pdorch-route"] == "pd"
        events = sse_events(response.text)
        assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1])
        assert _state(pd, first_choice) is ReplicaState.UNHEALTHY
        metrics = (await client.get("/metrics")).text
        assert "pdorch_decode_retries_total 1.0" in metrics


async def test_dead_replica_leaves_routing_within_a_second_by_health_probes() -> None:
    config = fleet(prefill=[sim(in_process=False)])
    async with run_coordinator(config) as pd:
        killed_at = time.monotonic()
        os.kill(_process_pid(pd, 0), signal.SIGKILL)
        await async_wait_until(
            _async(lambda: _state(pd, "prefill-0") is ReplicaState.UNHEALTHY),
            timeout=1.0,
            message="prefill-0 ejected by the health checker",
        )
        assert time.monotonic() - killed_at < 1.0


@pytest.mark.parametrize("leg_client", LEG_CLIENTS)
async def test_slow_prefill_times_out_and_decode_prefills_locally(leg_client: str) -> None:
    config = fleet(
        prefill=[sim(time_scale=300.0)],  # 300x slower than real time: seconds per prefill
        coordinator={"prefill_timeout_s": 0.3, "leg_client": leg_client},
    )
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        started = time.monotonic()
        response = await client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": long_prompt(words=400)}],
                "max_tokens": 4,
            },
        )
        assert response.status_code == 200, response.text
        assert time.monotonic() - started < 5.0
        assert response.headers["x-pdorch-route"] == "fallback"
        assert response.headers["x-pdorch-prefill"] == "decode-0"
        metrics = (await client.get("/metrics")).text
        assert 'pdorch_prefill_failures_total{kind="timeout"} 1.0' in metrics
        # one timeout does not eject (two in a row do, HealthPolicy)
        assert _state(pd, "prefill-0") is ReplicaState.HEALTHY


@pytest.mark.parametrize("leg_client", LEG_CLIENTS)
async def test_client_disconnect_mid_stream_cancels_the_decode_leg(leg_client: str) -> None:
    config = fleet(decode=[sim(time_scale=1.0)], coordinator={"leg_client": leg_client})
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        decode = pd.coordinator.fleet.get("decode-0")
        assert decode is not None
        decode_url = decode.url
        body = {"model": MODEL, "prompt": long_prompt(), "max_tokens": 3000, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            chunks = response.aiter_raw()
            await anext(chunks)
            assert pd.coordinator.in_flight == 1
            assert pd.coordinator.token_load.tracked_requests("decode-0") == 1
        # leaving the block closed the connection mid-stream

        async def released() -> bool:
            view = (await client.get("/admin/pools")).json()
            running = await engine_metric(client, decode_url, RUNNING)
            return view["requests_in_flight"] == 0 and view["tracked_requests"] == 0 and not running

        await async_wait_until(released, timeout=5.0, message="load released, leg cancelled")
        metrics = (await client.get("/metrics")).text
        assert "pdorch_client_disconnects_total 1.0" in metrics


@pytest.mark.parametrize("leg_client", LEG_CLIENTS)
async def test_client_disconnect_during_prefill_releases_the_request(leg_client: str) -> None:
    config = fleet(prefill=[sim(time_scale=300.0)], coordinator={"leg_client": leg_client})
    async with run_coordinator(config) as pd:
        async with http_client(base_url=pd.url, timeout=0.5) as impatient:
            try:
                await impatient.post(
                    "/v1/completions",
                    json={"model": MODEL, "prompt": long_prompt(words=400), "max_tokens": 4},
                )
                raise AssertionError("the slow prefill should outlast the client's timeout")
            except httpx.ReadTimeout:
                pass
        async with http_client(base_url=pd.url, timeout=30.0) as client:

            async def released() -> bool:
                view = (await client.get("/admin/pools")).json()
                return bool(view["requests_in_flight"] == 0 and view["tracked_requests"] == 0)

            await async_wait_until(released, timeout=5.0, message="request released")
            metrics = (await client.get("/metrics")).text
            assert "pdorch_client_disconnects_total 1.0" in metrics
