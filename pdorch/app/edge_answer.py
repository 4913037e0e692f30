"""A whole answer written by the edge in one piece, without the ASGI `send()` round trips.

A non-streamed OpenAI answer is complete before its first byte goes out: status, headers and
body are known. The ASGI way to write it (`starlette.Response.__call__`) is two `send()`
awaits into uvicorn, which re-validates every header with two regular expressions, joins the
head, hands it to `edge.HeadCork` (a `call_soon` so the body can join it), then writes the
body: ~15-25 µs of Python per answer on the hot path (proxy-6, `benchmarks/results/proxy.md`).
pdorch's edge (`edge.py`) puts a `WholeAnswer` in the ASGI scope's extensions
(`scope["extensions"]["pdorch.answer"]`); `api.CoordinatorApp` hands it the finished
`Response` and it writes head + body with one `transport.write`, leaving uvicorn's cycle in
the state its own `send()` would (response started and complete, the request's event set, the
connection closed when it is not kept alive, `on_response` called so the next pipelined
request starts or the keep-alive timer is armed).

What stays on the ASGI path (`send_whole` answers False and writes nothing): an answer already
started, a transport whose writes are paused (uvicorn's `send` waits for the drain), an access
log (uvicorn's logs each answer), a header value with a control character (uvicorn raises).
A client already gone gets nothing, as uvicorn's `send` drops it. Under any other ASGI server
there is no extension and every answer takes the ASGI path.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HEADER_VALUE_RE, STATUS_LINE

ANSWER_EXTENSION = "pdorch.answer"
_CONNECTION = b"connection"


class Cork(Protocol):
    """`edge.HeadCork`, as seen from here."""

    def uncork(self) -> tuple[bytes, asyncio.Transport]:
        """Give the cycle its plain transport back; the bytes held (a head, else b"")."""
        ...


class WholeAnswer:
    """One request's whole-answer writer (module docstring). `cycle`: uvicorn's
    `RequestResponseCycle`; `cork`: the `edge.HeadCork` its answer would be written through."""

    __slots__ = ("_cork", "_cycle")

    def __init__(self, cycle: Any, cork: Cork) -> None:
        self._cycle = cycle
        self._cork = cork

    def send_whole(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes | memoryview
    ) -> bool:
        """Write the answer (True), or leave it to the ASGI path (False: nothing written)."""
        cycle = self._cycle
        if cycle.disconnected:
            return True  # as uvicorn's send: an answer nobody reads is dropped
        if cycle.response_started or cycle.flow.write_paused or cycle.access_log:
            return False
        status_line = STATUS_LINE.get(status)
        if status_line is None:
            return False
        keep_alive = cycle.keep_alive
        has_close = False
        # parts[0]: what the cork holds (a 100 Continue), filled in once every check passed
        parts: list[bytes | memoryview] = [b"", status_line]
        for name, value in cycle.default_headers:  # date, server: as uvicorn sends them
            parts += (name, b": ", value, b"\r\n")
        for name, value in headers:
            if HEADER_VALUE_RE.search(value):
                return False  # uvicorn's send raises on it: keep that behaviour
            if name == _CONNECTION and b"close" in value.lower():
                keep_alive = False
                has_close = True
            parts += (name, b": ", value, b"\r\n")
        if not keep_alive and not has_close:
            parts.append(b"connection: close\r\n")
        parts += (b"\r\n", body)
        parts[0], transport = self._cork.uncork()
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        cycle.keep_alive = keep_alive
        transport.write(b"".join(parts))
        cycle.response_complete = True
        cycle.message_event.set()
        if not keep_alive:
            transport.close()
        cycle.on_response()
        return True


def whole_response(
    content: bytes, content_type: str, headers: list[tuple[bytes, bytes]]
) -> Response:
    """A 200 whole answer (`content` as the engine sent it) with `headers` (lower-case raw
    pairs): the `Response` starlette's constructor would build from the same headers as a
    dict, raw headers in its order (`headers`, content-length, content-type), without its
    per-header lower/encode and key scans (proxy-9). A `text/` type without a charset, which
    starlette completes, takes starlette's constructor."""
    if content_type.startswith("text/"):
        named = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}
        return Response(content, 200, headers=named, media_type=content_type)
    response = Response.__new__(Response)
    response.status_code = 200
    response.media_type = content_type
    response.background = None
    response.body = content
    response.raw_headers = [
        *headers,
        (b"content-length", b"%d" % len(content)),
        (b"content-type", content_type.encode("latin-1")),
    ]
    return response


async def write_answer(response: Response, scope: Scope, receive: Receive, send: Send) -> None:
    """Write `response`: a whole answer in one write by the edge when it can (`WholeAnswer`),
    else (a stream, a background task, no edge, what `send_whole` declines) the ASGI way."""
    extensions = scope.get("extensions")
    answer = extensions.get(ANSWER_EXTENSION) if extensions else None
    if (
        isinstance(answer, WholeAnswer)
        and response.background is None
        and not isinstance(response, StreamingResponse)
        and answer.send_whole(response.status_code, response.raw_headers, response.body)
    ):
        return
    await response(scope, receive, send)
