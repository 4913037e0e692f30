"""`LegResponse`: one answer of the native leg client (`leg_client.py`), as its reader sees it.

The connection (`leg_client._Connection`) fills it from its socket reads (the body bytes of one
read as one `bytes`) and marks its head, its end or its failure; the reader awaits the head,
then `read()`s the whole body or iterates it read by read, and `close()`s it.

Flow control: a reader slower than the engine (a slow client behind the relay) leaves bytes
buffered; past `PAUSE_BYTES` the connection stops reading its socket (`pause_reading`) until
the reader catches up (`LegConnection.resume`), so memory stays bounded and TCP pushes back on
the engine.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from pdorch.app.leg_errors import LegDeadline, LegDisconnected

PAUSE_BYTES = 1 << 20  # buffered body bytes past which the socket is not read


class LegConnection(Protocol):
    """What an answer needs of its connection (`leg_client._Connection`)."""

    loop: asyncio.AbstractEventLoop

    def resume(self) -> None:
        """Read the socket again (the reader took the buffered bytes)."""

    def close(self) -> None:
        """Close the socket: the engine sees the disconnect and aborts the request."""


class LegResponse:
    """One answer: `status`, `content_type` once the head is in; the body by `read()` (all of
    it) or `async for` (the bytes of each socket read, de-chunked); `close()` when done.

    `close()` of an answer not read to the end closes the connection (the engine aborts the
    request); of a complete one it does nothing (the connection went back at its end)."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_conn",
        "_done",
        "_error",
        "_head",
        "_timer",
        "_until_eof",
        "_waiter",
        "content_type",
        "status",
    )

    def __init__(self, conn: LegConnection) -> None:
        self.status = 0
        self.content_type = "application/json"
        self._conn: LegConnection | None = conn
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._head = False  # the status and headers are in
        self._done = False  # the body's last byte is in
        self._error: BaseException | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._until_eof = False  # no length, not chunked: the body ends at the close

    # ---- the reader's side -------------------------------------------------------------------

    async def _wait(self) -> None:
        waiter = self._waiter
        if waiter is None:
            conn = self._conn
            loop = conn.loop if conn is not None else asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    async def head(self) -> None:
        """Wait for the status line and headers (the error that ended the leg, if any)."""
        while not self._head:
            if self._error is not None:
                raise self._error
            await self._wait()

    @property
    def at_eof(self) -> bool:
        """Every body byte was received and handed out."""
        return self._done and not self._chunks

    async def read(self) -> bytes:
        """The whole (rest of the) body."""
        while not self._done:
            if self._error is not None:
                raise self._error
            await self._wait()
        chunks = self._chunks
        self._chunks = []
        self._buffered = 0
        if len(chunks) == 1:
            return chunks[0]
        return b"".join(chunks)

    def __aiter__(self) -> LegResponse:
        return self

    async def __anext__(self) -> bytes:
        while True:
            chunks = self._chunks
            if chunks:
                self._chunks = []
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                if self._buffered > PAUSE_BYTES and self._conn is not None:
                    self._conn.resume()
                self._buffered = 0
                return data
            if self._error is not None:
                raise self._error
            if self._done:
                raise StopAsyncIteration
            await self._wait()

    def close(self) -> None:
        """Done with the answer (see the class docstring). Idempotent."""
        self._cancel_timer()
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        if self._error is None:
            self._error = LegDisconnected("the answer was closed before its end")
        self._wake()
        conn.close()

    # ---- the connection's side ---------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self._done or self._error is not None:
            return
        self._error = error
        self._cancel_timer()
        self._wake()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        conn = self._conn
        self._fail(LegDeadline("the leg's deadline passed"))
        if conn is not None:
            self._conn = None
            conn.close()
