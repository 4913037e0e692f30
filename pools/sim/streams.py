"""What the sim server's HTTP layer reads from an engine: one async stream of deltas per request."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pools.sim.outputs import RequestOutput


class _Aborts(Protocol):
    def abort(self, request_id: str) -> None: ...


class EngineUnavailable(RuntimeError):
    """The engine is stopped or its loop crashed: no request can be served."""


@dataclass(slots=True)
class StreamDelta:
    """What one step produced for one request, as the HTTP layer consumes it."""

    token_ids: list[int]
    finish_reason: str | None
    error: str | None = None


class RequestStream:
    """The async iterator of one request's deltas; `final` is the core's last output."""

    __slots__ = ("_engine", "_event", "_items", "done", "final", "request_id")

    def __init__(self, engine: _Aborts, request_id: str) -> None:
        self._engine = engine
        self.request_id = request_id
        self._items: deque[StreamDelta] = deque()
        self._event = asyncio.Event()
        self.final: RequestOutput | None = None
        self.done = False

    def push(self, item: StreamDelta) -> None:
        self._items.append(item)
        self._event.set()

    def __aiter__(self) -> AsyncIterator[StreamDelta]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[StreamDelta]:
        while True:
            while self._items:
                item = self._items.popleft()
                yield item
                if item.finish_reason is not None or item.error is not None:
                    return
            self._event.clear()
            await self._event.wait()

    def close(self) -> None:
        """Abort the request if it is still running (client gone); idempotent."""
        if not self.done:
            self._engine.abort(self.request_id)

    def cancel(self) -> None:
        """The client went away while someone iterates: abort the request (its blocks are
        freed) and end the iteration with finish reason `"abort"`; a finished request is
        left as it is."""
        if not self.done:
            self._engine.abort(self.request_id)
            self.push(StreamDelta([], "abort"))
