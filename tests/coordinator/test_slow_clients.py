"""Issue 14 items 3-4: slow-loris, idle, slow-body and half-closed clients, the connection limit
(`pdorch/app/edge.py`), over raw TCP sockets against a live coordinator.

The coordinator must keep serving everyone else while such clients hold connections, cut each
one at `coordinator.header_timeout_s` / `body_timeout_s` with an OpenAI-shaped 408 (503 past
`max_connections`), and hold nothing for them afterwards (no request in flight). The
whole-request deadline (`request_timeout_s`, 504) is `test_errors.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from typing import Any

import pytest
from pydantic import ValidationError

from pdorch.app.server import run_coordinator
from pdorch.config.fleet import CoordinatorSettings
from pools.http_client import http_client
from tests.coordinator.helpers import MODEL, fleet
from tests.waiting import async_wait_until

REQUEST = {"model": MODEL, "prompt": "hello there", "max_tokens": 2}
SLOW = 40  # slow-loris connections at once


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


async def _until_closed(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    trickle: bytes | None,
    limit_s: float,
) -> tuple[bytes, float]:
    """Read until the server closes (sending one `trickle` byte every 0.2 s of silence);
    what it sent and how long it took. Fails past `limit_s` (a hang)."""
    started = time.monotonic()
    got = b""
    while time.monotonic() - started < limit_s:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), 0.2)
        except TimeoutError:  # the pacing of a slow client: one more byte
            if trickle is not None:
                try:
                    writer.write(trickle)
                    await writer.drain()
                except ConnectionError:
                    pass
            continue
        except ConnectionError:
            break
        if not chunk:
            break
        got += chunk
    else:
        raise AssertionError(f"connection still open after {limit_s} s, got {got[:200]!r}")
    writer.close()
    return got, time.monotonic() - started


def _openai_error(raw: bytes, status: int) -> dict[str, Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), raw[:300]
    assert b"connection: close" in head.lower(), head
    error = json.loads(body)["error"]
    assert {"message", "type", "param", "code"} <= set(error), error
    return dict(error)


async def _normal_requests_succeed(url: str, count: int) -> None:
    async with http_client(base_url=url, timeout=30.0) as client:
        for _ in range(count):
            response = await client.post("/v1/completions", json=REQUEST)
            assert response.status_code == 200, response.text


async def test_slow_loris_idle_and_slow_body_clients_are_cut_while_others_are_served() -> None:
    config = fleet(coordinator={"header_timeout_s": 1.0, "body_timeout_s": 1.5})
    async with run_coordinator(config) as pd:
        host, port = _address(pd.url)
        conns = [await asyncio.open_connection(host, port) for _ in range(SLOW)]
        for _, writer in conns:  # a request line and a header that never ends
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        idle = await asyncio.open_connection(host, port)  # sends nothing at all
        body_reader, body_writer = await asyncio.open_connection(host, port)
        body_writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 4000\r\n\r\n{"model": "'
        )
        watchers = [
            asyncio.ensure_future(_until_closed(r, w, b"a", limit_s=10.0)) for r, w in conns
        ]
        idle_watch = asyncio.ensure_future(_until_closed(*idle, None, limit_s=10.0))
        body_watch = asyncio.ensure_future(
            _until_closed(body_reader, body_writer, b" ", limit_s=10.0)
        )
        # everyone else is served meanwhile
        await _normal_requests_succeed(pd.url, 10)
        results = await asyncio.gather(*watchers)
        for raw, took in results:
            error = _openai_error(raw, 408)
            assert error["code"] == "header_timeout", error
            assert took < 5.0, took  # cut near header_timeout_s, not left open
        raw, took = await idle_watch
        assert _openai_error(raw, 408)["code"] == "header_timeout"
        raw, took = await body_watch
        error = _openai_error(raw, 408)
        assert error["code"] == "body_timeout" and "body_timeout_s" in error["message"]

        async def nothing_held() -> bool:
            return pd.coordinator.in_flight == 0

        await async_wait_until(nothing_held, timeout=5.0, message="no request held")
        await _normal_requests_succeed(pd.url, 2)


async def test_connections_past_the_limit_get_503_and_the_rest_keep_working() -> None:
    config = fleet(coordinator={"max_connections": 4, "header_timeout_s": 30.0})
    async with run_coordinator(config) as pd:
        host, port = _address(pd.url)
        held = [await asyncio.open_connection(host, port) for _ in range(4)]
        # accepted in arrival order: the four are counted before this one
        extra = await asyncio.open_connection(host, port)
        raw, _ = await _until_closed(*extra, None, limit_s=10.0)
        error = _openai_error(raw, 503)
        assert error["code"] == "too_many_connections" and "max_connections" in error["message"]
        # a held connection still gets its answer
        reader, writer = held[0]
        body = json.dumps(REQUEST).encode()
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        raw, _ = await _until_closed(reader, writer, None, limit_s=30.0)
        assert raw.startswith(b"HTTP/1.1 200 "), raw[:300]
        for _, w in held[1:]:
            w.close()

        async def free() -> bool:  # the slots come back once those connections are gone
            try:
                await _normal_requests_succeed(pd.url, 1)
            except AssertionError:
                return False
            return True

        await async_wait_until(free, timeout=10.0, message="connections released")


async def test_half_closed_clients_are_let_go_and_leave_nothing_behind() -> None:
    async with run_coordinator(fleet()) as pd:
        host, port = _address(pd.url)
        body = json.dumps({**REQUEST, "stream": True, "max_tokens": 50}).encode()
        whole = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        cases = {
            "after the request": whole,
            "mid-headers": whole[:30],
            "mid-body": whole[:-10],
            "before anything": b"",
        }
        for name, sent in cases.items():
            sock = socket.create_connection((host, port))
            sock.sendall(sent)
            sock.shutdown(socket.SHUT_WR)  # half-closed: nothing more will come from us
            reader, writer = await asyncio.open_connection(sock=sock)
            # the server ends the connection (after an answer or not), never leaves it hanging
            raw, _ = await _until_closed(reader, writer, None, limit_s=10.0)
            assert not raw or raw.startswith(b"HTTP/1.1 "), (name, raw[:200])

        async def nothing_held() -> bool:
            return pd.coordinator.in_flight == 0

        await async_wait_until(nothing_held, timeout=10.0, message="no request held")
        await _normal_requests_succeed(pd.url, 2)


def test_edge_limits_are_checked_and_name_the_field() -> None:
    settings = CoordinatorSettings()
    assert (settings.max_connections, settings.header_timeout_s, settings.body_timeout_s) == (
        4096,
        10.0,
        60.0,
    )
    for field, bad in (("max_connections", 0), ("header_timeout_s", 0), ("body_timeout_s", -1)):
        with pytest.raises(ValidationError, match=field):
            CoordinatorSettings.model_validate({field: bad})


async def test_an_endless_header_is_cut_while_it_streams_and_garbage_gets_an_openai_400() -> None:
    config = fleet(coordinator={"header_timeout_s": 30.0})
    async with run_coordinator(config) as pd:
        host, port = _address(pd.url)
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        sent, answer = 0, b""
        try:  # fast, never ending: the header deadline is far, the size limit is not
            while sent < 64 << 20 and not answer:
                writer.write(b"a" * 65536)
                await writer.drain()
                sent += 65536
                with contextlib.suppress(TimeoutError):
                    answer = await asyncio.wait_for(reader.read(65536), 0.01)
        except ConnectionError:
            pass
        assert answer, f"no answer after {sent} bytes of one header"
        assert sent < 8 << 20, sent  # cut near max_header_bytes (64 KiB), not at 64 MiB
        writer.write_eof()  # the server drops the rest, then closes on our FIN
        raw, _ = await _until_closed(reader, writer, None, limit_s=10.0)
        assert _openai_error(answer + raw, 431)["code"] == "headers_too_large"
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        raw, _ = await _until_closed(reader, writer, None, limit_s=10.0)
        assert _openai_error(raw, 400)["code"] == "invalid_http"
        await _normal_requests_succeed(pd.url, 1)
