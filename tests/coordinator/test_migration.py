"""Stream migration (issue 14): a decode engine killed or stopped mid-answer, the request goes
on on another decode replica from prompt + the tokens already streamed. Real engine processes
(simulated engines), the real coordinator, real signals."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import httpx
import pytest

from pdorch.app.server import RunningCoordinator
from pools.replica import ReplicaState
from tests.coordinator.decode_processes import (
    assert_settled,
    decode_process_fleet,
    engine_pid,
    labelled_counter,
)
from tests.coordinator.helpers import (
    LEG_CLIENTS,
    MODEL,
    RUNNING,
    answer_text,
    engine_metric,
    long_prompt,
    sse_events,
    stream_text,
)
from tests.waiting import async_wait_until

PATHS = {False: "/v1/completions", True: "/v1/chat/completions"}


def _body(prompt: str, chat: bool, stream: bool, max_tokens: int, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "stream": stream}
    body["temperature"] = 0.0  # greedy
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return {**body, **extra}


async def _stream_with_signal(
    client: httpx.AsyncClient, body: dict[str, Any], chat: bool, pd: RunningCoordinator, sig: int
) -> tuple[list[Any], str]:
    """Stream `body`; after 3 events send `sig` to the decode engine; all events + its id."""
    async with client.stream("POST", PATHS[chat], json=body) as response:
        assert response.status_code == 200, await response.aread()
        decode = response.headers["x-pdorch-decode"]
        received = b""
        chunks = response.aiter_raw()
        while received.count(b"data: ") < 3:
            received += await anext(chunks)
        os.kill(engine_pid(pd, decode), sig)
        async for chunk in chunks:
            received += chunk
    return sse_events(received.decode()), decode


def _check_one_stream(events: list[Any], reference: list[Any], chat: bool) -> None:
    """Same text, same id/created throughout, index 0, no error, summed usage."""
    assert events[-1] == "[DONE]"
    payloads = [e for e in events if isinstance(e, dict)]
    assert not any("error" in e for e in payloads), payloads[-3:]
    assert stream_text(events, chat) == stream_text(reference, chat)
    assert {e["id"] for e in payloads} == {payloads[0]["id"]}
    assert {e["created"] for e in payloads} == {payloads[0]["created"]}
    assert {e["object"] for e in payloads} == {payloads[0]["object"]}
    assert all(c["index"] == 0 for e in payloads for c in e["choices"])
    # the client did not ask for token ids: none leak
    assert all(c.get("token_ids") is None for e in payloads for c in e["choices"])
    usage, ref_usage = payloads[-1]["usage"], reference[-2]["usage"]
    assert usage["prompt_tokens"] == ref_usage["prompt_tokens"]
    assert usage["completion_tokens"] == ref_usage["completion_tokens"]
    assert usage["total_tokens"] == ref_usage["total_tokens"]


@pytest.mark.parametrize("leg_client", LEG_CLIENTS)
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_decode_killed_mid_stream_continues_on_the_other_replica_with_the_same_text(
    chat: bool, leg_client: str
) -> None:
    async with decode_process_fleet(coordinator={"leg_client": leg_client}) as (pd, client):
        body = _body(long_prompt(), chat, True, 300, stream_options={"include_usage": True})
        reference = sse_events((await client.post(PATHS[chat], json=body)).text)
        assert stream_text(reference, chat) and reference[-1] == "[DONE]"
        events, decode = await _stream_with_signal(client, body, chat, pd, signal.SIGKILL)
        _check_one_stream(events, reference, chat)
        migrations = await labelled_counter(client, "pdorch_migrations_total")
        assert migrations["connection"] + migrations["eof"] == 1, migrations
        replica = pd.coordinator.fleet.get(decode)
        assert replica is not None and replica.state is ReplicaState.UNHEALTHY
        await assert_settled(pd, client)


@pytest.mark.parametrize("leg_client", LEG_CLIENTS)
async def test_decode_stopped_mid_stream_is_continued_after_the_stall_timeout(
    leg_client: str,
) -> None:
    settings = {"stall_timeout_s": 1.0, "leg_client": leg_client}
    async with decode_process_fleet(coordinator=settings) as (pd, client):
        body = _body(long_prompt(), False, True, 300, stream_options={"include_usage": True})
        reference = sse_events((await client.post("/v1/completions", json=body)).text)
        loop = asyncio.get_running_loop()
        started = loop.time()
        events, decode = await _stream_with_signal(client, body, False, pd, signal.SIGSTOP)
        _check_one_stream(events, reference, False)
        assert loop.time() - started < 30.0
        assert (await labelled_counter(client, "pdorch_migrations_total"))["stall"] == 1
        replica = pd.coordinator.fleet.get(decode)
        assert replica is not None and replica.consecutive_failures >= 1


async def test_migration_limit_reached_ends_the_stream_with_an_error_event_and_done() -> None:
    async with decode_process_fleet(coordinator={"migration_limit": 1}) as (pd, client):
        body = _body(long_prompt(), False, True, 400)
        async with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            first = response.headers["x-pdorch-decode"]
            other = next(r for r in ("decode-0", "decode-1") if r != first)
            received = b""
            chunks = response.aiter_raw()
            while received.count(b"data: ") < 3:
                received += await anext(chunks)
            os.kill(engine_pid(pd, first), signal.SIGKILL)
            before = received.count(b"data: ")
            while received.count(b"data: ") < before + 3:  # the continuation streams
                received += await anext(chunks)
            os.kill(engine_pid(pd, other), signal.SIGKILL)
            async for chunk in chunks:
                received += chunk
        events = sse_events(received.decode())
        assert events[-1] == "[DONE]"
        error = events[-2]["error"]
        assert "migration_limit=1 reached" in error["message"], error
        assert other in error["message"]
        assert not any("error" in e for e in events[:-2] if isinstance(e, dict))
        refused = await labelled_counter(client, "pdorch_migrations_refused_total")
        assert refused["limit"] == 1, refused
        await assert_settled(pd, client)


@pytest.mark.parametrize("leg_client", LEG_CLIENTS)
@pytest.mark.parametrize(
    ("sig", "reason"),
    [(signal.SIGKILL, "connection"), (signal.SIGSTOP, "stall")],
    ids=["kill", "stop"],
)
async def test_non_streamed_request_survives_its_decode_engine(
    sig: int, reason: str, leg_client: str
) -> None:
    """Killed: the connection fails; stopped: nothing times a whole answer, the health checker
    finds the replica unhealthy and the waiting leg is hung up. Either way it starts over."""
    async with decode_process_fleet(coordinator={"leg_client": leg_client}) as (pd, client):
        body = _body(long_prompt(), False, False, 600)
        reference = (await client.post("/v1/completions", json=body)).json()
        task = asyncio.ensure_future(client.post("/v1/completions", json=body))
        urls = {r.replica_id: r.url for r in pd.coordinator.fleet.replicas("decode")}

        async def busy() -> str | None:
            for replica_id, url in urls.items():
                if await engine_metric(client, url, RUNNING) > 0:
                    return replica_id
            return None

        decode = await async_wait_until(busy, timeout=10.0, message="the decode leg running")
        os.kill(engine_pid(pd, decode), sig)
        response = await task
        assert response.status_code == 200, response.text
        assert response.headers["x-pdorch-decode"] != decode
        answer = response.json()
        assert answer_text(answer, False) == answer_text(reference, False)
        assert answer["usage"] == reference["usage"]
        migrations = await labelled_counter(client, "pdorch_migrations_total")
        assert migrations[reason] == 1, migrations
        await assert_settled(pd, client)


@pytest.mark.parametrize("leg_client", LEG_CLIENTS)
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_decode_engine_stopping_mid_stream_its_error_event_is_continued_not_passed_on(
    chat: bool, leg_client: str
) -> None:
    """SIGTERM: the stopping engine (the simulator, like vLLM) ends its open streams with an
    in-band `data: {"error": ...}` event and `[DONE]`; the coordinator continues the stream on
    the other replica instead of passing the error to the client."""
    async with decode_process_fleet(coordinator={"leg_client": leg_client}) as (pd, client):
        body = _body(long_prompt(), chat, True, 300, stream_options={"include_usage": True})
        reference = sse_events((await client.post(PATHS[chat], json=body)).text)
        events, _ = await _stream_with_signal(client, body, chat, pd, signal.SIGTERM)
        _check_one_stream(events, reference, chat)
        migrations = await labelled_counter(client, "pdorch_migrations_total")
        # the error event as a rule; a connection closed first (eof/reset) is continued too
        assert migrations["error_event"] + migrations["eof"] + migrations["connection"] == 1
        await assert_settled(pd, client)
