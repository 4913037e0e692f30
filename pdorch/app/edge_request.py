"""A client's OpenAI POST as the request logic reads it: raw headers, body, disconnect.

The request logic of `POST /v1/completions` and `/v1/chat/completions` (`api.serve_openai`:
auth, then `flow.RequestFlow`: admission, body, parse, legs) is one copy, fed from two places:

- `AsgiRequest`: from an ASGI call (`api.CoordinatorApp.__call__`: any server, and pdorch's
  edge whenever its fast path does not apply): the body read from `receive`, the disconnect
  from the edge's extension or a task waiting in `receive` (`disconnect.py`).
- `EdgeRequest`: from pdorch's edge protocol directly (`edge.py`, its fast path): the raw
  header list and the body the protocol buffered, the disconnect from `connection_lost`; no
  ASGI `receive` loop, no `Request` object (`benchmarks/proxy/edge_micro.py` times both).

Both give the same answers: 413 past the body limit, `ClientGone` when the client left before
its body was read, the first of a repeated header (as starlette's `Headers.get`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from starlette.types import Receive, Scope

from pdorch.app.disconnect import DisconnectWatch, Watch, watch_disconnect
from pdorch.app.leg_wait import ClientGone, body_too_large, read_asgi_body
from pdorch.app.openai_schema import RequestKind

_AUTHORIZATION = b"authorization"


class ClientRequest(Protocol):
    """What the request logic reads of a client's request (module docstring)."""

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        """The raw header pairs, names lower-case, in the order sent."""
        ...

    async def body(self, limit: int) -> bytes:
        """The whole body; 413 `ApiError` past `limit` bytes; `ClientGone` if it left."""
        ...

    def watch_disconnect(self, callback: Callable[[], None]) -> Watch:
        """Call `callback` once when the client leaves, until the watch's `stop()`."""
        ...


def authorization(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The first `Authorization` header's value, as starlette's `Headers.get` reads it."""
    for name, value in headers:
        if name == _AUTHORIZATION:
            return value.decode("latin-1")
    return None


class AsgiRequest:
    """A client request from an ASGI call."""

    __slots__ = ("headers", "receive", "scope")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.scope = scope
        self.receive = receive
        self.headers: list[tuple[bytes, bytes]] = scope["headers"]

    async def body(self, limit: int) -> bytes:
        return await read_asgi_body(self.headers, self.receive, limit)

    def watch_disconnect(self, callback: Callable[[], None]) -> Watch:
        return watch_disconnect(self.scope, self.receive, callback)


class Replayed:
    """`request` with its body read already (a several-model fleet read it to pick the
    model, `api.serve_dispatched`): the same body again, the same disconnect."""

    __slots__ = ("_body", "_request")

    def __init__(self, request: ClientRequest, body: bytes) -> None:
        self._request = request
        self._body = body

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return self._request.headers

    async def body(self, limit: int) -> bytes:
        if len(self._body) > limit:
            raise body_too_large(limit)
        return self._body

    def watch_disconnect(self, callback: Callable[[], None]) -> Watch:
        return self._request.watch_disconnect(callback)


class EdgeRequest:
    """A client request buffered whole by the edge protocol (`edge.py`'s fast path).
    `cycle`: uvicorn's `RequestResponseCycle` of the request (its body buffer, `disconnected`
    flag, and what the answer is written through); `watch`: its `DisconnectWatch`."""

    __slots__ = ("_cycle", "_watch", "headers", "kind")

    def __init__(
        self,
        kind: RequestKind,
        headers: list[tuple[bytes, bytes]],
        cycle: Any,
        watch: DisconnectWatch,
    ) -> None:
        self.kind = kind
        self.headers = headers
        self._cycle = cycle
        self._watch = watch

    async def body(self, limit: int) -> bytes:
        cycle = self._cycle
        if cycle.disconnected:  # as uvicorn's receive(): a client gone reads as gone
            raise ClientGone()
        body = cycle.body
        cycle.body = bytearray()  # consumed, as a receive() of it would leave the cycle
        if len(body) > limit:
            raise body_too_large(limit)
        return bytes(body)

    def watch_disconnect(self, callback: Callable[[], None]) -> Watch:
        self._watch.start(callback)
        return self._watch
