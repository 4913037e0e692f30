"""Issue 14 (overload): shedding at the request head (`pdorch/app/head_shed.py`, `edge.py`)
against live coordinators and real HTTP: while the event loop lags, unprotected requests get
429 `loop_lag` before their body is read and protected ones are still served; past
`max_pending_requests` heads waiting for their handler, 429 `pending`; `/health` and
`/metrics` are never shed.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.chaos.overload import Answer, send_stream
from pdorch.app.admission import PRIORITY_HEADER
from pdorch.app.server import run_coordinator
from pools.http_client import http_client
from tests.coordinator.helpers import MODEL, fleet
from tests.serve_process import serve_process
from tests.waiting import async_wait_until

REQUEST = {"model": MODEL, "prompt": "hello there", "max_tokens": 2}


def _hold_the_loop(seconds: float) -> None:
    """Keep the event loop busy (CPU, no yield) for `seconds`: a CPU-bound stall of the
    coordinator, which shares this test's loop (`run_coordinator` in-process)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def _post(client: httpx.AsyncClient, priority: int) -> httpx.Response:
    return await client.post(
        "/v1/completions", json=REQUEST, headers={PRIORITY_HEADER: str(priority)}
    )


def _rejected(metrics: str, reason: str) -> float:
    found = re.search(rf'^pdorch_rejected_total\{{reason="{reason}"\}} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


async def test_while_the_loop_lags_unprotected_requests_get_429_and_protected_are_served() -> None:
    config = fleet(coordinator={"head_shed": {"max_lag_s": 0.25, "hold_s": 4.0}})
    async with run_coordinator(config) as pd, http_client(base_url=pd.url, timeout=30.0) as client:

        async def low_served() -> bool:
            return (await _post(client, -10)).status_code == 200

        await async_wait_until(low_served, timeout=20.0, message="a low request served")
        # lows shed while that wait polled (a loaded box lags past 0.25 s on its own) count too
        shed_before = _rejected((await client.get("/metrics")).text, "loop_lag")
        _hold_the_loop(1.0)
        low = await _post(client, -10)
        normal = await _post(client, 0)
        high = await _post(client, 1)  # protected_priority 1 (the default)
        health = await client.get("/health")
        metrics = (await client.get("/metrics")).text
        for shed in (low, normal):
            assert shed.status_code == 429, shed.text
            assert shed.headers["retry-after"] == "1"
            error = shed.json()["error"]
            assert error["type"] == "rate_limit_error" and error["code"] == "overloaded"
            assert "loop_lag" in error["message"] and "max_lag_s=0.25" in error["message"]
        assert high.status_code == 200, high.text
        assert health.status_code == 200
        assert _rejected(metrics, "loop_lag") - shed_before == 2.0
        assert "pdorch_event_loop_lag_seconds " in metrics
        # the gate opens again once no sample over the bound was seen for hold_s
        await async_wait_until(low_served, timeout=30.0, message="low requests served again")
        assert pd.head_shed is not None and pd.head_shed.pending == 0


async def test_past_max_pending_requests_unprotected_heads_get_429_pending() -> None:
    config = fleet(coordinator={"head_shed": {"max_pending_requests": 3}})
    async with run_coordinator(config) as pd:
        host, port = pd.url.removeprefix("http://").split(":")
        conns = [await asyncio.open_connection(host, int(port)) for _ in range(12)]
        for reader, writer in conns:  # each one accepted and idle in keep-alive
            writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        body = json.dumps(REQUEST).encode()
        # all twelve heads written before the coordinator's loop (this one) runs again: it
        # reads them in one turn, before any handler starts
        for index, (_, writer) in enumerate(conns):
            priority = -10 if index < 10 else 5  # the last two protected
            writer.write(
                b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"%s: %d\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
                % (PRIORITY_HEADER.encode(), priority, len(body), body)
            )
        answers = [await reader.read() for reader, _ in conns]
        for _, writer in conns:
            writer.close()
        statuses = [int(a.split(b" ", 2)[1]) for a in answers]
        assert statuses[:3] == [200, 200, 200], answers[:3]
        assert statuses[3:10] == [429] * 7, statuses
        assert statuses[10:] == [200, 200], answers[10:]
        for shed in answers[3:10]:
            head, _, rest = shed.partition(b"\r\n\r\n")
            assert b"retry-after: 1" in head.lower()
            error = json.loads(rest)["error"]
            assert error["code"] == "overloaded" and "pending" in error["message"]
        assert pd.head_shed is not None and pd.head_shed.pending == 0
        assert pd.coordinator.in_flight == 0


def _fleet_file() -> dict[str, Any]:
    sim = {
        "kind": "sim",
        "count": 1,
        "model_profile": "llama-3.1-8b",
        "gpu": "h100",
        "time_scale": 0.2,
        "kv_transport": "tcp",
    }
    return {
        "served_model_name": MODEL,
        "block_size": 16,
        "pools": {"prefill": {"launch": [sim]}, "decode": {"launch": [sim]}},
        "pd": {"min_uncached_tokens": 32},
        "health": {"timeout_s": 2.0},
        # a lag bound and a pending cap low enough that a 400-connect storm trips them on an
        # idle machine too (at 50 ms the quiet CI box's loop never lagged enough)
        "coordinator": {
            "head_shed": {"max_lag_s": 0.002, "hold_s": 1.0, "max_pending_requests": 8}
        },
    }


async def test_a_burst_of_low_priority_clients_is_shed_fast_and_high_priority_is_admitted(
    tmp_path: Path,
) -> None:
    """A real overload: `pdorch serve` in its own process, 400 low-priority streams at once
    (bare sockets: the client must not be the bottleneck) while high-priority ones keep
    going; the coordinator's loop lags under the connect storm."""
    with serve_process(_fleet_file(), tmp_path) as served:
        host, port = served.url.removeprefix("http://").split(":")
        stream = {**REQUEST, "stream": True, "max_tokens": 16}

        async def one(priority: int) -> Answer:
            return await send_stream(
                host, int(port), stream, {PRIORITY_HEADER: str(priority)}, read_refusal=True
            )

        async def high_clients(done: asyncio.Event) -> list[Answer]:
            answers: list[Answer] = []
            while not done.is_set() or not answers:
                answers.append(await one(10))
            return answers

        done = asyncio.Event()
        steady = asyncio.ensure_future(high_clients(done))
        async with asyncio.timeout(120):
            burst = await asyncio.gather(*(one(-10) for _ in range(400)))
            done.set()
            highs = await steady
        shed = [a for a in burst if a.status == 429]
        assert all(a.status == 200 and a.error is None for a in highs), highs
        assert shed, "nothing shed: neither the 2 ms lag bound nor the pending cap of 8 tripped"
        assert all(b"loop_lag" in a.body or b"pending" in a.body for a in shed)
        assert all(a.retry_after == "1" for a in shed)
        assert all(a.status in (200, 429) and a.error is None for a in burst), [
            a for a in burst if a.status not in (200, 429) or a.error
        ][:3]
        # shed at the head: a 429 comes back well before a served stream's end
        served_s = sorted(a.total_s for a in burst if a.status == 200)
        if served_s:
            assert sorted(a.total_s for a in shed)[len(shed) // 2] < served_s[len(served_s) // 2]
        async with http_client(base_url=served.url, timeout=10.0) as client:
            metrics = (await client.get("/metrics")).text
        assert _rejected(metrics, "loop_lag") + _rejected(metrics, "pending") == len(shed)


async def _read_answer(reader: asyncio.StreamReader) -> int:
    """One HTTP/1.1 answer with a content-length off `reader`; its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


async def test_pipelined_heads_leave_pending_when_they_run_or_their_connection_drops() -> None:
    """`pending` counts a head in when it is let through and out when its handler starts: a
    pipelined one starts only after the answer ahead of it, and one whose connection closes
    first never starts, so the edge counts it out at the connection's loss."""
    async with run_coordinator(fleet()) as pd:
        assert pd.head_shed is not None
        host, port = pd.url.removeprefix("http://").split(":")
        body = json.dumps(REQUEST).encode()
        one = (
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(one * 3)  # three heads in one read: one runs, two wait behind it
        assert [await _read_answer(reader) for _ in range(3)] == [200, 200, 200]
        writer.close()
        await writer.wait_closed()

        async def settled() -> bool:
            assert pd.head_shed is not None
            return pd.head_shed.pending == 0 and pd.coordinator.in_flight == 0

        await async_wait_until(settled, timeout=20.0, message="pending back to 0 (answered)")
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(one * 4)  # then gone before any answer: three never start
        writer.close()
        await writer.wait_closed()
        await async_wait_until(settled, timeout=20.0, message="pending back to 0 (dropped)")
