"""`NativeLegClient`: the legs' HTTP/1.1 client on asyncio (uvloop) protocols + httptools
(`coordinator.leg_client: native`; `aiohttp`, `upstream.py`, is the other).

Why: the relay profile (`benchmarks/results/proxy.md`, "relay-perf") spent ~95 µs per request
in aiohttp's Python request glue (`ClientRequest`, header multidicts, the connector's
bookkeeping) around the two `send()`s, plus its per-chunk reading (`StreamReader.feed_data`,
`iter_any`). A leg needs far less: one POST with a fixed header set, a status, one header
(`content-type`), the body as it arrives. Here a request is one pre-joined `write()`, the
answer is parsed by httptools (C, llhttp) in `data_received`, and each read's body bytes
(de-chunked, not re-chunked) are handed to the reader as one `bytes`.

Pool: keep-alive connections per engine (host, port), at most `per_replica` open at once
(`coordinator.upstream_connections_per_replica`; 0: no cap). A leg past the cap waits in a FIFO
for a connection (a released one is handed over directly) or for a free slot (one closed);
the wait has no timer of its own (the flow's deadlines bound it, as with aiohttp: a queued leg
never reads as a connect failure of a healthy engine). Idle connections are reused
most-recent-first and dropped when idle past `KEEPALIVE_TIMEOUT_S` (4 s, below uvicorn's 5 s
idle close: we never reuse a connection the engine is just closing), checked lazily at
checkout (no timer per connection). A connection goes back to the pool only when its answer
was read to the end and the engine kept it alive (HTTP/1.1, no `connection: close`); an answer
closed early (client gone, stall, failure, drain cut) closes the socket, so the engine sees the
disconnect and aborts the request.

Timers: the connect (`connect_timeout_s`) has one; a leg may have one deadline for the whole
answer (`deadline_s`, one `call_later` per leg, never re-armed per packet); by default none:
the flow's `prefill_timeout_s` / `request_timeout_s` / first-byte deadline and the relay's
stall watchdog bound every leg, as on aiohttp (`upstream.py`).

Errors: `leg_errors.py` (all `LegClientError`, mapped to the flow's failure kinds there);
the answer type, its reader side and flow control: `leg_response.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from typing import cast
from urllib.parse import urlsplit

import httptools

from pdorch.app.leg_errors import (
    LegClientError,
    LegConnectError,
    LegConnectTimeout,
    LegDeadline,
    LegDisconnected,
    LegProtocolError,
)
from pdorch.app.leg_response import PAUSE_BYTES, LegResponse

__all__ = [
    "KEEPALIVE_TIMEOUT_S",
    "LegClientError",
    "LegConnectError",
    "LegConnectTimeout",
    "LegDeadline",
    "LegDisconnected",
    "LegProtocolError",
    "LegResponse",
    "NativeLegClient",
]

KEEPALIVE_TIMEOUT_S = 4.0
_MAX_URLS = 4096  # parsed URLs cached (replicas x paths); cleared past it


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to one engine; at most one answer in flight."""

    __slots__ = (
        "_keep_alive",
        "_length_known",
        "_pieces",
        "closed",
        "idle_since",
        "loop",
        "parser",
        "paused",
        "pool",
        "response",
        "transport",
    )

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: LegResponse | None = None
        self.closed = False
        self.idle_since = 0.0
        self.paused = False
        self._keep_alive = True
        self._pieces: list[bytes] = []  # body bytes of the current read
        self._length_known = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not `asyncio.Transport` subclasses; they have its methods
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a request is one write: never wait for an ACK (Nagle)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # bytes nobody asked for (a stray answer): unusable
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response._fail(LegProtocolError(f"bad HTTP answer: {exc}"))
            self.close()
            return
        pieces = self._pieces
        if pieces:
            self._pieces = []
            chunk = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            response._chunks.append(chunk)
            response._buffered += len(chunk)
            if response._buffered > PAUSE_BYTES and not self.paused and self.transport:
                self.paused = True
                self.transport.pause_reading()
            response._wake()
        if response._done:
            self._answer_done(response)

    def eof_received(self) -> bool:
        if self.response is None:  # an idle connection the engine closes: never reuse it
            self.closed = True
        return False  # the transport closes itself; `connection_lost` ends the answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.discard(self)
        response = self.response
        self.response = None
        if response is None:
            return
        if response._until_eof and response._head and not response._done:
            if self._pieces:
                response._chunks.append(b"".join(self._pieces))
                self._pieces = []
            response._done = True  # a body without length ends at the close
            response._conn = None
            response._cancel_timer()
            response._wake()
            return
        reason = f"reset ({exc})" if exc is not None else "closed by the engine"
        response._fail(LegDisconnected(f"connection {reason} before the answer ended"))

    # httptools callbacks (never raise from them: httptools wraps the error)
    # Bytes after the answer's end (a second answer we never asked for) make the connection
    # unusable: `_keep_alive` False, it closes at the end of this read.
    def on_header(self, name: bytes, value: bytes) -> None:
        response = self.response
        if response is None or response._done:
            self._keep_alive = False
            return
        lowered = name.lower()
        if lowered == b"content-type":
            response.content_type = value.decode("latin-1")
        elif lowered == b"content-length" or (
            lowered == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            self._length_known = True

    def on_headers_complete(self) -> None:
        response = self.response
        if response is None or response._done:
            self._keep_alive = False
            return
        response.status = self.parser.get_status_code()
        self._keep_alive = self.parser.should_keep_alive()
        # 1xx/204/304 have no body; otherwise no length and no chunking: the body runs to EOF
        no_body = response.status < 200 or response.status in (204, 304)
        response._until_eof = not self._length_known and not no_body
        response._head = True
        response._wake()

    def on_body(self, body: bytes) -> None:
        response = self.response
        if response is None or response._done:
            self._keep_alive = False
            return
        self._pieces.append(body)

    def on_message_complete(self) -> None:
        response = self.response
        if response is None or response._done:
            self._keep_alive = False
            return
        response._done = True

    # ---- use ---------------------------------------------------------------------------------

    def send(self, request: bytes) -> LegResponse:
        response = self.response = LegResponse(self)
        self._length_known = False
        self._keep_alive = True
        assert self.transport is not None
        self.transport.write(request)
        return response

    def _answer_done(self, response: LegResponse) -> None:
        """The answer's last byte is in: the connection is free (its bytes stay in the
        answer's buffer), back to the pool when the engine keeps it alive."""
        self.response = None
        response._conn = None
        response._cancel_timer()
        response._wake()
        if self._keep_alive and not self.paused:
            self.idle_since = self.loop.time()
            self.pool.release(self)
        else:
            self.close()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.response = None
        if self.transport is not None:
            self.transport.close()
        self.pool.discard(self)


class _Pool:
    """The connections to one engine (see the module docstring, "Pool")."""

    __slots__ = (
        "_connecting",
        "cap",
        "connect_timeout_s",
        "host",
        "idle",
        "loop",
        "open",
        "port",
        "waiters",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        host: str,
        port: int,
        cap: int,
        connect_timeout_s: float,
    ) -> None:
        self.loop = loop
        self.host = host
        self.port = port
        self.cap = cap  # 0: no cap
        self.connect_timeout_s = connect_timeout_s
        self.idle: deque[_Connection] = deque()
        self.open: set[_Connection] = set()  # connected and in use or idle
        # legs waiting for a connection: a future resolved with one (handed over) or with
        # None (a slot freed: connect a new one)
        self.waiters: deque[asyncio.Future[_Connection | None]] = deque()
        self._connecting = 0  # connects in progress: they hold a slot too

    def _slots_used(self) -> int:
        return len(self.open) + self._connecting

    async def acquire(self) -> _Connection:
        idle = self.idle
        if idle:
            stale_before = self.loop.time() - KEEPALIVE_TIMEOUT_S
            while idle and idle[0].idle_since < stale_before:  # oldest first: expired
                idle.popleft().close()
            while idle:
                conn = idle.pop()  # the warmest
                if not conn.closed:
                    return conn
        if self.cap and self._slots_used() >= self.cap:
            waiter: asyncio.Future[_Connection | None] = self.loop.create_future()
            self.waiters.append(waiter)
            try:
                conn_or_slot = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    handed = waiter.result()  # woken and cancelled at once: pass it on
                    if handed is not None:
                        self.release(handed)
                    else:
                        self._wake_one()
                else:
                    with contextlib.suppress(ValueError):
                        self.waiters.remove(waiter)
                raise
            if conn_or_slot is not None:
                return conn_or_slot
        return await self._connect()

    async def _connect(self) -> _Connection:
        self._connecting += 1
        try:
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    _, protocol = await self.loop.create_connection(
                        lambda: _Connection(self), self.host, self.port
                    )
            except TimeoutError:
                raise LegConnectTimeout(
                    f"no connection to {self.host}:{self.port} within "
                    f"connect_timeout_s={self.connect_timeout_s:g}"
                ) from None
            except OSError as exc:
                raise LegConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        except BaseException:
            self._connecting -= 1
            self._wake_one()
            raise
        self._connecting -= 1
        assert isinstance(protocol, _Connection)
        if protocol.closed:  # closed before we got it
            self._wake_one()
            raise LegDisconnected(f"{self.host}:{self.port} closed the new connection")
        self.open.add(protocol)
        return protocol

    def release(self, conn: _Connection) -> None:
        """A connection whose answer was read to the end: to a waiting leg, else idle."""
        if conn.closed:
            return
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self.idle.append(conn)

    def discard(self, conn: _Connection) -> None:
        """A connection closed: its slot is free for a waiting leg."""
        if conn in self.open:
            self.open.discard(conn)
            self._wake_one()

    def _wake_one(self) -> None:
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        waiters, self.waiters = self.waiters, deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(LegConnectError("the leg client is closed"))
        for conn in list(self.open):
            conn.close()
        self.idle.clear()


class NativeLegClient:
    """The legs' client (module docstring). Create it on the running loop; `close()` on stop.

    `per_replica`: connections open to one engine at most (0: no cap)."""

    def __init__(self, connect_timeout_s: float, per_replica: int = 1024) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.per_replica = per_replica
        self.loop = asyncio.get_running_loop()
        self._pools: dict[tuple[str, int], _Pool] = {}
        # url → (pool, request line + host header): parsed once per replica and path
        self._urls: dict[str, tuple[_Pool, bytes]] = {}
        self.closed = False

    def _target(self, url: str) -> tuple[_Pool, bytes]:
        hit = self._urls.get(url)
        if hit is not None:
            return hit
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise LegConnectError(f"{url!r}: the native leg client speaks plain http:// only")
        host, port = parts.hostname, parts.port or 80
        pool = self._pools.get((host, port))
        if pool is None:
            pool = self._pools[(host, port)] = _Pool(
                self.loop, host, port, self.per_replica, self.connect_timeout_s
            )
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        netloc = host if ":" not in host else f"[{host}]"
        start = f"POST {path} HTTP/1.1\r\nhost: {netloc}:{port}\r\n".encode("latin-1")
        if len(self._urls) >= _MAX_URLS:
            self._urls.clear()
        self._urls[url] = (pool, start)
        return pool, start

    async def post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        deadline_s: float | None = None,
    ) -> LegResponse:
        """POST `body` with `headers`; the answer once its head is in (status, content type).
        `deadline_s`: the whole answer's deadline (`LegDeadline`); None: none. The caller
        must `close()` the answer (a fully read one closes itself)."""
        if self.closed:
            raise LegConnectError("the leg client is closed")
        pool, start = self._target(url)
        extra = "".join([f"{k}: {v}\r\n" for k, v in headers.items()])
        request = b"".join(
            (start, extra.encode("latin-1"), b"content-length: %d\r\n\r\n" % len(body), body)
        )
        conn = await pool.acquire()
        response = conn.send(request)
        if deadline_s is not None:
            response._timer = self.loop.call_later(deadline_s, response._expire)
        try:
            await response.head()
        except BaseException:  # failed, or cancelled (client gone): the engine must see it
            response.close()
            raise
        return response

    async def close(self) -> None:
        self.closed = True
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self._urls.clear()

    def connections(self, url: str) -> tuple[int, int]:
        """(open, idle) connections to `url`'s engine (tests, admin)."""
        parts = urlsplit(url)
        pool = self._pools.get((parts.hostname or "", parts.port or 80))
        if pool is None:
            return 0, 0
        return len(pool.open), len(pool.idle)
