"""Microbenchmark: one whole-answer POST through pdorch's edge protocol, µs per request.

    python -m benchmarks.proxy.edge_micro [REQUESTS] [--modes asgi,fast,parse]

A real `edge.edge_protocol` (uvicorn's httptools protocol with pdorch's limits) on a uvloop
loop, fed a `POST /v1/completions` (the bench client's seven headers, a 500-byte body) on one
kept-alive connection by a recording transport (no socket); each request is fed, then awaited
until its answer's one write. The request logic is a stub that does what the flow does with
the client's request and nothing else (its routing headers, its body, its disconnect watch
started and stopped, a `whole_response` with the route headers), so what is timed is the edge
and the layers between it and the handler:

- `asgi`: the ASGI path: uvicorn's cycle runs `CoordinatorApp.__call__`'s lean branch (the
  431 header sum, the request, the handler, the whole answer through `WholeAnswer`).
- `fast`: the edge's fast path (`coordinator.edge_fast_path`): the handler called from the
  protocol with the raw headers and the body it buffered (`edge_fast.py`).
- `parse`: the floor: the protocol's parsing callbacks and cycle, the answer written from
  `_start_asgi_task` at once (no task, no app): what no path can skip.

Min over 5 repeats, the modes taking turns repeat by repeat (a load spike hits all alike).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

import uvicorn
import uvloop
from starlette.responses import Response
from uvicorn.server import ServerState

from pdorch.app.api import CoordinatorApp
from pdorch.app.edge import edge_protocol
from pdorch.app.edge_answer import whole_response
from pdorch.app.edge_request import ClientRequest
from pdorch.app.flow import _routing_headers
from pdorch.app.openai_schema import RequestKind
from pdorch.config.coordinator import CoordinatorSettings

BODY = b'{"model":"tiny","prompt":"' + b"hello world " * 40 + b'","max_tokens":4}'
REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:8000\r\nuser-agent: bench/1.0\r\n"
    b"accept: */*\r\naccept-encoding: gzip, deflate\r\nconnection: keep-alive\r\n"
    b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(BODY)
) + BODY
ANSWER = b'{"id":"cmpl-1","object":"text_completion","choices":[{"text":" a b c d"}]}'
ROUTE_RAW = [
    (b"x-request-id", b"pdorch-0123456789abcdef0000000000000001"),
    (b"x-pdorch-prefill", b"p0"),
    (b"x-pdorch-decode", b"d0"),
    (b"x-pdorch-route", b"pd"),
]
LIMIT = 1 << 20


def _left() -> None:
    raise AssertionError("the micro's client never leaves")


async def stub_handler(kind: RequestKind, request: ClientRequest) -> Response:
    """What the flow does with the client's request, and nothing else (module docstring)."""
    _routing_headers(request.headers)
    body = await request.body(LIMIT)
    assert len(body) == len(BODY)
    watch = request.watch_disconnect(_left)
    watch.stop()
    return whole_response(ANSWER, "application/json", ROUTE_RAW)


class _Transport:
    """A socket's transport as the protocol uses it; each write resolves `answered`."""

    def __init__(self) -> None:
        self.answered: asyncio.Future[bytes] | None = None
        self.closed = False

    def write(self, data: bytes) -> None:
        if self.answered is not None and not self.answered.done():
            self.answered.set_result(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(
            name, default
        )

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass


def _answer_at_once(self: Any, cycle: Any, app: Any) -> None:
    """`parse`'s `_start_asgi_task`: the answer written at once, no task and no app."""
    cycle.response_started = cycle.response_complete = True
    self.transport.write(ANSWER)
    cycle.on_response()


def _floor_protocol(settings: CoordinatorSettings) -> type[Any]:
    """The edge protocol whose requests are answered from `_start_asgi_task` (`parse`)."""
    return type("Floor", (edge_protocol(settings),), {"_start_asgi_task": _answer_at_once})


class _StubApp(CoordinatorApp):
    """The coordinator app with the stub request logic (what the micro times around it)."""

    async def serve_post(self, kind: RequestKind, request: ClientRequest) -> Response:
        return await stub_handler(kind, request)


def _make(mode: str) -> tuple[Any, _Transport]:
    settings = CoordinatorSettings(edge_fast_path=mode == "fast")
    app = _StubApp()
    app.max_header_bytes = settings.max_header_bytes
    app.models = None
    config = uvicorn.Config(
        app, access_log=False, log_level="warning", lifespan="off", proxy_headers=False
    )
    config.load()
    if mode == "parse":
        cls = _floor_protocol(settings)
    else:
        cls = edge_protocol(settings, fast=app.serve_post if mode == "fast" else None)
    protocol = cls(config=config, server_state=ServerState(), app_state={})
    transport = _Transport()
    protocol.connection_made(transport)
    return protocol, transport


async def _run(mode: str, n: int) -> float:
    protocol, transport = _make(mode)
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    for _ in range(n):
        answered = transport.answered = loop.create_future()
        protocol.data_received(REQUEST)
        await answered
    took = time.perf_counter() - start
    protocol.connection_lost(None)
    return took / n * 1e6


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv and argv[0].isdigit() else 20000
    modes = ["asgi", "fast", "parse"]
    if "--modes" in argv:
        modes = argv[argv.index("--modes") + 1].split(",")
    best: dict[str, float] = {m: float("inf") for m in modes}
    runner: Callable[[Any], Any] = uvloop.run
    for _ in range(5):
        for mode in modes:
            best[mode] = min(best[mode], runner(_run(mode, n)))
    for mode in modes:
        print(f"{mode:6s} {best[mode]:7.2f} µs/request")


if __name__ == "__main__":
    main(sys.argv[1:])
