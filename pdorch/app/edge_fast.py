"""The edge's fast path: the two OpenAI POSTs served from the HTTP protocol, not through ASGI.

`coordinator.edge_fast_path` (default below, `pools/FLEET_API.md`). For `POST /v1/completions`
and `POST /v1/chat/completions`, pdorch's edge protocol (`edge.py`) holds the request's
handler back until its body is whole, then calls the request logic (`api.CoordinatorApp
.serve_post`, the one the ASGI route calls: auth, admission, body, parse, legs) with what the
protocol has: the raw header list and the body it buffered (`edge_request.EdgeRequest`), and
writes the answer with the edge's one-write path (`edge_answer.write_answer`). What it skips
per request: the app's ASGI entry (`CoordinatorApp.__call__`'s checks), starlette's `Request`,
the body read through `receive()` (an `http.request` message built and awaited), and the
disconnect watch looked up in the scope (`benchmarks/proxy/edge_micro.py`: µs per request).

What it keeps: uvicorn's `RequestResponseCycle` and its task (`run_asgi`: a handler that raises
still gets uvicorn's 500), so pipelining (a request behind an answer not sent waits in
uvicorn's queue), keep-alive, the head cork, disconnect (`connection_lost`, `disconnect.py`),
shutdown and a stream's relay (`write_answer` sends a stream the ASGI way) stay uvicorn's.

Taken only when every check below holds, else the request goes through ASGI unchanged (the
same request logic, through `CoordinatorApp.__call__`):
- the exact path (a query string, `%`-escapes or a `root_path` go through ASGI), method POST,
  no `Expect: 100-continue` (uvicorn sends the 100 when the app first reads), no upgrade;
- not pipelined behind an answer not yet sent (uvicorn queues it);
- a `Content-Length` (one, digits) of at most 64 KiB (uvicorn's read-pause mark: past it
  uvicorn stops reading until the app reads, and here nobody reads before the body is whole),
  no `Transfer-Encoding` (a chunked body: its 413 while it streams in is `read_body`'s);
- headers within `max_header_bytes` (`api.py` answers the 431).
A client that leaves (or is cut at `body_timeout_s`) before its body is whole still gets its
handler run, which reads `ClientGone` and is counted as a 499 disconnect, as the ASGI path does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

from starlette.responses import Response
from starlette.types import Receive, Scope, Send
from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT

from pdorch.app.edge_answer import write_answer
from pdorch.app.edge_request import ClientRequest, EdgeRequest
from pdorch.app.openai_schema import RequestKind

FAST_URLS: dict[bytes, RequestKind] = {
    b"/v1/completions": "completion",
    b"/v1/chat/completions": "chat",
}
REQUEST_EXTENSION = "pdorch.request"  # the scope's `EdgeRequest` of a fast-path request
MAX_FAST_BODY_BYTES = HIGH_WATER_LIMIT
_CONTENT_LENGTH = b"content-length"
_TRANSFER_ENCODING = b"transfer-encoding"

Handler = Callable[[RequestKind, ClientRequest], Awaitable[Response]]


def fast_kind(protocol: Any, max_header_bytes: int) -> RequestKind | None:
    """The request's kind when the fast path takes it, else None (module docstring). Read at
    the end of its head, before uvicorn builds its cycle; `protocol`: the edge protocol."""
    kind = FAST_URLS.get(protocol.url)
    if kind is None or protocol.expect_100_continue or protocol.root_path:
        return None
    parser = protocol.parser
    if parser.get_method() != b"POST" or parser.should_upgrade():
        return None
    cycle = protocol.cycle
    if cycle is not None and not cycle.response_complete:
        return None
    length: bytes | None = None
    size = 0
    for name, value in protocol.headers:
        size += len(name) + len(value)
        if name == _CONTENT_LENGTH:
            if length is not None:
                return None
            length = value
        elif name == _TRANSFER_ENCODING:
            return None
    if size > max_header_bytes or length is None or not length.isdigit():
        return None
    return kind if int(length) <= MAX_FAST_BODY_BYTES else None


def fast_app(handler: Handler) -> ASGI3Application:
    """The coroutine function uvicorn's cycle runs for a fast-path request (`run_asgi`: its
    500 on a bug): the request logic on the buffered request, then its answer."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        request: EdgeRequest = scope["extensions"][REQUEST_EXTENSION]
        response = await handler(request.kind, request)
        await write_answer(response, scope, receive, send)

    return cast(ASGI3Application, serve)  # starlette's scope types, uvicorn's typed dicts
