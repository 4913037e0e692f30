"""The edge's fast path (`pdorch/app/edge_fast.py`, `coordinator.edge_fast_path`): the same
answers as the ASGI path, byte for byte but the date and ids, from one coordinator served by
two HTTP servers (fast path on and off); pipelined requests answered in order; a client that
leaves mid-body counted as a disconnect."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from pdorch.app.server import RunningCoordinator, coordinator_http_server, run_coordinator
from pdorch.config.coordinator import CoordinatorSettings
from tests.coordinator.helpers import MODEL, fleet
from tests.waiting import async_wait_until

KEY = "sk-edge-fast"
# names whose values differ per request or per second (the rest must be the same bytes)
VARYING = {b"date", b"x-request-id"}


@dataclass
class Servers:
    pd: RunningCoordinator
    fast: str  # host:port of the server with the fast path on
    asgi: str  # and off


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    # every request disaggregated: the second of a pair, its prefix cached, routes as the first
    config = fleet(coordinator={"api_keys": [KEY]}, pd={"min_uncached_tokens": 0})
    async with run_coordinator(config) as pd:
        on = coordinator_http_server(
            pd.app, "127.0.0.1", 0, CoordinatorSettings(port=0, edge_fast_path=True)
        )
        off = coordinator_http_server(
            pd.app, "127.0.0.1", 0, CoordinatorSettings(port=0, edge_fast_path=False)
        )
        fast = urlsplit(await on.start()).netloc
        try:
            asgi = urlsplit(await off.start()).netloc
            try:
                yield Servers(pd, fast, asgi)
            finally:
                await off.stop()
        finally:
            await on.stop()


def _request(path: str, body: bytes, key: str | None = KEY, extra: bytes = b"") -> bytes:
    auth = b"authorization: Bearer %s\r\n" % key.encode() if key is not None else b""
    return (
        b"POST %s HTTP/1.1\r\nhost: pdorch\r\ncontent-type: application/json\r\n%s%s"
        b"content-length: %d\r\n\r\n" % (path.encode(), auth, extra, len(body))
    ) + body


async def _read_answer(
    reader: asyncio.StreamReader,
) -> tuple[bytes, list[tuple[bytes, bytes]], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    headers = [tuple(line.split(b": ", 1)) for line in lines[1:]]
    pairs = [(n.lower(), v) for n, v in headers]
    length = int(next(v for n, v in pairs if n == b"content-length"))
    return lines[0], pairs, await reader.readexactly(length)


async def _exchange(
    hostport: str, data: bytes, answers: int = 1
) -> list[tuple[bytes, list[tuple[bytes, bytes]], bytes]]:
    host, port = hostport.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        return [await asyncio.wait_for(_read_answer(reader), 30) for _ in range(answers)]
    finally:
        writer.close()


def _comparable(answer: tuple[bytes, list[tuple[bytes, bytes]], bytes]) -> tuple[object, ...]:
    status, headers, body = answer
    kept = [(n, v) for n, v in headers if n not in VARYING]
    try:
        parsed = json.loads(body)
    except ValueError:
        return status, kept, body
    if isinstance(parsed, dict):
        for varying in ("id", "created"):
            parsed.pop(varying, None)
    return status, kept, parsed


COMPLETION = json.dumps({"model": MODEL, "prompt": "edge fast path " * 4, "max_tokens": 3})
CHAT = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
)
CASES = [
    ("completion", "/v1/completions", COMPLETION.encode(), KEY, 200),
    ("chat", "/v1/chat/completions", CHAT.encode(), KEY, 200),
    ("bad json", "/v1/completions", b"{not json", KEY, 400),
    ("unknown model", "/v1/completions", b'{"model":"nope","prompt":"x"}', KEY, 404),
    ("missing key", "/v1/completions", COMPLETION.encode(), None, 401),
    ("wrong key", "/v1/chat/completions", CHAT.encode(), "sk-wrong", 401),
]


@pytest.mark.parametrize(
    ("name", "path", "body", "key", "status"), CASES, ids=[c[0] for c in CASES]
)
async def test_fast_and_asgi_answers_are_the_same_bytes(
    servers: Servers, name: str, path: str, body: bytes, key: str | None, status: int
) -> None:
    request = _request(path, body, key)
    [fast] = await _exchange(servers.fast, request)
    [asgi] = await _exchange(servers.asgi, request)
    assert fast[0].startswith(b"HTTP/1.1 %d " % status), (name, fast)
    assert _comparable(fast) == _comparable(asgi)
    if status >= 400:
        error = json.loads(fast[2])["error"]
        assert set(error) == {"message", "type", "param", "code"}


async def test_pipelined_requests_are_answered_in_order(servers: Servers) -> None:
    one = json.dumps({"model": MODEL, "prompt": "first " * 8, "max_tokens": 1}).encode()
    three = json.dumps({"model": MODEL, "prompt": "third " * 8, "max_tokens": 3}).encode()
    data = (
        _request("/v1/completions", one)
        + _request("/v1/completions", b'{"model":"nope","prompt":"x"}')
        + _request("/v1/completions", three)
    )
    answers = await _exchange(servers.fast, data, answers=3)
    assert [a[0].split(b" ")[1] for a in answers] == [b"200", b"404", b"200"]
    tokens = [json.loads(a[2])["usage"]["completion_tokens"] for a in (answers[0], answers[2])]
    assert tokens == [1, 3]


async def test_a_client_gone_mid_body_is_counted_as_a_disconnect(servers: Servers) -> None:
    metrics = servers.pd.coordinator.metrics

    async def disconnects() -> bool:
        return "pdorch_client_disconnects_total 1.0" in metrics.render().decode()

    assert not await disconnects()
    body = COMPLETION.encode()
    host, port = servers.fast.rsplit(":", 1)
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(_request("/v1/completions", body)[: -len(body) // 2])
    await writer.drain()
    writer.close()
    await async_wait_until(disconnects, 10, message="the 499 counted")
