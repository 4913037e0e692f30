"""The coordinator's connection edge: limits uvicorn does not set, enforced per connection.

uvicorn's HTTP protocol has no deadline for a request's headers or body (only an idle
keep-alive timeout *between* requests) and its `limit_concurrency` answers plain text; so one
client holding many connections open and trickling bytes (slow-loris) keeps sockets, admission
slots and buffers forever. `edge_protocol(settings)` is uvicorn's httptools protocol with three
limits from the fleet file's `coordinator:` section:

- `max_connections` [4096]: a new connection past it gets 503 `too_many_connections` and is
  closed at once.
- `header_timeout_s` [10 s]: from a connection's opening (a kept-alive connection: from its
  next request's first byte) until the headers are complete; past it, 408 `header_timeout`
  and closed. A connection that sends nothing at all is cut the same way.
- `body_timeout_s` [60 s]: from the end of the headers until the whole body is in; past it,
  unless an answer has started, 408 `body_timeout` and closed (the handler sees a disconnect).
- `max_header_bytes` [64 KiB] + 16 KiB for the request line and framing: a request head still
  not complete past that many bytes gets 431 `headers_too_large` and is closed *while it
  streams in* (httptools buffers a head of any size; `api.py`'s 431 only sees complete heads,
  so without this a client could send gigabytes of one header within `header_timeout_s`).
- A request that is no HTTP at all gets uvicorn's 400, in the OpenAI shape (`invalid_http`).
- Head shedding (`head_shed.py`, `coordinator.head_shed`): a client POST to an OpenAI route
  whose `x-pdorch-priority` is below `protected_priority` gets 429 `loop_lag` (the event loop
  lags past `max_lag_s`) or 429 `pending` (`max_pending_requests` heads already wait for their
  handler) with `Retry-After` as soon as its head is parsed: no handler task, its body never
  buffered (what still comes is dropped, the connection closed after the answer).
- Not a limit: every answer's head goes out with its first body bytes in one write
  (`HeadCork`; uvicorn writes them apart; a whole OpenAI answer is written by the edge in one
  piece, `edge_answer.py`), and every request's disconnect is told to the app
  from `connection_lost` (`disconnect.py`: no task per request waiting in `receive()`).
- Not a limit: with `fast` (`coordinator.edge_fast_path`), the two OpenAI POSTs are served from
  here, not through ASGI: their handler called with the raw headers and the buffered body
  once it is whole (`edge_fast.py`, which lists what still goes through ASGI).

Each answer is OpenAI-shaped (`errors.py`) with `connection: close`. The whole-request
deadline (`request_timeout_s`, 504) starts after the body (`flow.py`); headers over
`max_header_bytes` get 431 (`api.py`). Defaults: real clients send headers in one packet
(< 1 ms on a LAN, one RTT over the internet) and a 1 MiB prompt body in well under a second;
60 s lets a 32 MiB body (`max_body_bytes`) in at ~4.5 Mbit/s. 4096 connections is within a
typical `ulimit -n` raised for a server.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import msgspec
from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from pdorch.app.admission import PRIORITY_HEADER, parse_priority
from pdorch.app.deadlines import Deadline, DeadlineQueue, Deadlines
from pdorch.app.disconnect import DISCONNECT_EXTENSION, DisconnectWatch
from pdorch.app.edge_answer import ANSWER_EXTENSION, WholeAnswer
from pdorch.app.edge_fast import REQUEST_EXTENSION, Handler, fast_app, fast_kind
from pdorch.app.edge_request import EdgeRequest
from pdorch.app.head_shed import SHED_PATHS, HeadShed
from pdorch.app.openai_schema import RequestKind
from pdorch.config.coordinator import CoordinatorSettings

_encode = msgspec.json.Encoder().encode
_REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}
HEAD_SLACK_BYTES = 16 * 1024  # request line, separators: past max_header_bytes' names + values
# after a 431 mid-head: how long the rest is read and dropped before the socket closes (closing
# on unread bytes sends a reset, which can reach the client before the 431 it should read)
LINGER_S = 2.0


_PRIORITY = PRIORITY_HEADER.encode()


def _error_bytes(
    status: int, message: str, error_type: str, code: str, extra_head: bytes = b""
) -> bytes:
    body = _encode({"error": {"message": message, "type": error_type, "param": None, "code": code}})
    head = (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"%sconnection: close\r\n\r\n" % (status, _REASONS[status], len(body), extra_head)
    )
    return head + body


def shed_answers(settings: CoordinatorSettings) -> dict[str, bytes]:
    """The 429 each head-shed reason gets (whole HTTP answers, built once)."""
    shed = settings.head_shed
    retry = b"retry-after: %d\r\n" % settings.admission.retry_after_s
    return {
        "loop_lag": _error_bytes(
            429,
            "The coordinator is overloaded: its event loop runs more than "
            f"coordinator.head_shed.max_lag_s={shed.max_lag_s:g} s late: loop_lag; retry later."
            if shed.max_lag_s is not None
            else "The coordinator is overloaded: loop_lag; retry later.",
            "rate_limit_error",
            "overloaded",
            retry,
        ),
        "pending": _error_bytes(
            429,
            f"The coordinator is overloaded: {shed.max_pending_requests} requests wait for it "
            "(coordinator.head_shed.max_pending_requests): pending; retry later.",
            "rate_limit_error",
            "overloaded",
            retry,
        ),
    }


class HeadCork:
    """A response's transport until its first body write: uvicorn writes the status line and
    headers (`http.response.start`) in a `send()` of their own, and the body in another;
    this holds the head and writes it with the first body bytes, one syscall (and one wake
    of the client) per answer less. A head with no body write in the same loop turn (a
    stream whose first event is not ready) goes out alone at the next turn. Then the cycle
    gets its plain transport back: a stream's later writes pay nothing for this."""

    __slots__ = ("_cycle", "_flush", "_head", "_loop", "_transport")

    def __init__(
        self, transport: asyncio.Transport, cycle: Any, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._transport = transport
        self._cycle = cycle
        self._loop = loop
        self._head: bytes | None = None
        self._flush: asyncio.Handle | None = None

    def write(self, data: bytes) -> None:
        if self._flush is None:  # the head: hold it for the first body bytes
            self._head = data
            self._flush = self._loop.call_soon(self._release)
            return
        self._flush.cancel()
        head, self._head = self._head, None
        self._cycle.transport = self._transport
        self._transport.write(head + data if head else data)

    def _release(self) -> None:
        head, self._head = self._head, None
        self._cycle.transport = self._transport
        if head and not self._transport.is_closing():
            self._transport.write(head)

    def uncork(self) -> tuple[bytes, asyncio.Transport]:
        """The cycle's plain transport back, and the bytes held (b"" if none): the whole
        answer writes them with its own (`edge_answer.WholeAnswer`), one write."""
        if self._flush is not None:
            self._flush.cancel()
        head, self._head = self._head, None
        self._cycle.transport = self._transport
        return head or b"", self._transport

    def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._release()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, ...
        return getattr(self._transport, name)


def edge_protocol(
    settings: CoordinatorSettings,
    shed: HeadShed | None = None,
    fast: Handler | None = None,
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the edge limits of `settings` (module docstring);
    `shed`: head shedding (its `pending` counted in and out here; `shed.on_shed(reason)` per
    request shed); `fast`: the OpenAI POSTs' request logic, called from here for the requests
    the fast path takes (`edge_fast.py`; None: every request through ASGI)."""
    fast_serve = fast_app(fast) if fast is not None else None
    max_header_bytes = settings.max_header_bytes
    shed_bytes = shed_answers(settings)
    max_connections = settings.max_connections
    header_timeout_s = settings.header_timeout_s
    body_timeout_s = settings.body_timeout_s
    max_head_bytes = settings.max_header_bytes + HEAD_SLACK_BYTES
    busy = _error_bytes(
        503,
        f"Too many connections (coordinator.max_connections={max_connections}).",
        "service_unavailable_error",
        "too_many_connections",
    )
    slow_headers = _error_bytes(
        408,
        f"Request headers not complete within coordinator.header_timeout_s={header_timeout_s:g}.",
        "timeout_error",
        "header_timeout",
    )
    slow_body = _error_bytes(
        408,
        f"Request body not complete within coordinator.body_timeout_s={body_timeout_s:g}.",
        "timeout_error",
        "body_timeout",
    )

    head_too_big = _error_bytes(
        431,
        f"Request headers exceed {settings.max_header_bytes} bytes.",
        "invalid_request_error",
        "headers_too_large",
    )

    deadlines = Deadlines()  # every connection's header and body deadlines

    class EdgeProtocol(HttpToolsProtocol):
        _edge_timer: tuple[DeadlineQueue, Deadline] | None = None  # header or body deadline
        _edge_reading_body = False
        _edge_in_head = True  # bytes now are a request head (or the gap before one)
        _edge_head_bytes = 0
        _edge_discard = False  # answered 431: drop what still comes, then close
        _edge_linger: asyncio.TimerHandle | None = None
        _edge_watch: DisconnectWatch | None = None  # the current request's (disconnect.py)
        _edge_fast_kind: RequestKind | None = None  # its head is being let in on the fast path
        _edge_fast: Any = None  # the fast-path cycle whose handler waits for its whole body

        def data_received(self, data: bytes) -> None:
            if self._edge_discard:
                return
            if self._edge_in_head:
                self._edge_head_bytes += len(data)
            super().data_received(data)
            if (
                self._edge_in_head
                and self._edge_head_bytes > max_head_bytes
                and not self.transport.is_closing()
            ):
                self._edge_disarm()
                self._edge_discard = True
                self.transport.write(head_too_big)
                if self.transport.can_write_eof():
                    self.transport.write_eof()  # after the answer: FIN, the client reads it
                self._edge_linger = self.loop.call_later(LINGER_S, self.transport.close)

        def send_400_response(self, msg: str) -> None:
            bad = _error_bytes(400, msg, "invalid_request_error", "invalid_http")
            self.transport.write(bad)
            self.transport.close()

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            # asyncio's own (wider) parameter type, so no override ignore; uvicorn narrows it
            # to `Transport` under an ignore of its own. A cast, not an isinstance: uvloop's
            # TCP transports are no `asyncio.Transport` subclass, yet have its methods
            tcp = cast(asyncio.Transport, transport)
            super().connection_made(tcp)
            # `connections` holds this one already: over the limit means more than it
            if len(self.connections) > max_connections:
                tcp.write(busy)
                tcp.close()
                return
            self._edge_arm(header_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            self._edge_disarm()
            if shed is not None:  # pipelined requests that will never start: counted in
                shed.pending -= len(self.pipeline)  # at their heads, never out by a task
            if self._edge_linger is not None:
                self._edge_linger.cancel()
            super().connection_lost(exc)
            cycle: Any = self.cycle
            watch = self._edge_watch
            if watch is not None and cycle is not None and cycle.disconnected:
                watch.lost()  # the moment uvicorn marks it disconnected (answer not complete)
            if self._edge_fast is not None:  # left mid-body: its handler reads ClientGone and
                self._edge_start_fast()  # counts the 499, as on the ASGI path

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._edge_discard:
                return
            if self._edge_timer is None:  # a kept-alive connection's next request
                self._edge_arm(header_timeout_s)

        def on_headers_complete(self) -> None:
            if self._edge_discard:  # a pipelined head behind a shed one, in the same read
                return
            if shed is not None and self._edge_shed_head(shed):
                return
            before = self.cycle
            if fast_serve is not None:
                self._edge_fast_kind = fast_kind(self, max_header_bytes)
            super().on_headers_complete()  # a fast-path cycle's task: held (`_start_asgi_task`)
            kind, self._edge_fast_kind = self._edge_fast_kind, None
            cycle: Any = self.cycle
            if shed is not None and cycle is not before:  # let through: pending until it runs
                shed.pending += 1  # (out in `_start_asgi_task`, or `connection_lost` if never)
            if cycle is not None and cycle is not before:
                # the answer's head and its first body bytes: one write (a whole answer: its
                # head and body in one, `edge_answer.py`); its disconnect, told (disconnect.py)
                cork = cycle.transport = HeadCork(self.transport, cycle, self.loop)
                watch = self._edge_watch = DisconnectWatch(cycle)
                extensions = cycle.scope["extensions"] = {
                    DISCONNECT_EXTENSION: watch,
                    ANSWER_EXTENSION: WholeAnswer(cycle, cork),
                }
                if kind is not None and self._edge_fast is cycle:
                    extensions[REQUEST_EXTENSION] = EdgeRequest(kind, self.headers, cycle, watch)
            self._edge_in_head = False
            self._edge_head_bytes = 0
            self._edge_reading_body = True
            self._edge_arm(body_timeout_s)

        def _edge_shed_head(self, shed: HeadShed) -> bool:
            """Shed this request at its head when `shed` says so (module docstring)."""
            if self.parser.get_method() != b"POST":
                return False
            cycle: Any = self.cycle
            if cycle is not None and not cycle.response_complete:
                return False  # pipelined behind an answer not sent yet: answers keep their order
            if self.url.split(b"?", 1)[0] not in SHED_PATHS:
                return False
            priority = 0
            for name, value in self.headers:
                if name == _PRIORITY:
                    priority = parse_priority(value.decode("latin-1"))
            reason = shed.decide(priority, self.loop.time())
            if reason is None:
                return False
            self._edge_disarm()
            self._edge_discard = True
            self._edge_in_head = False
            self.transport.write(shed_bytes[reason])
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self._edge_linger = self.loop.call_later(LINGER_S, self.transport.close)
            if shed.on_shed is not None:
                shed.on_shed(reason)
            return True

        def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
            # every handler task starts here: at once from `on_headers_complete`, or a
            # pipelined one when the answer ahead of it is complete, a fast-path one when its
            # body is whole (`_edge_start_fast`). The count goes out in the loop turn the task
            # takes its first step (call_soon is FIFO, after the task's step): pending = heads
            # let through whose handler has not run yet
            if self._edge_fast_kind is not None and app is self.app:
                self._edge_fast = cycle  # the fast path: its handler once the body is in
                return
            super()._start_asgi_task(cycle, app)
            if shed is not None:
                self.loop.call_soon(shed.handler_started)

        def on_body(self, body: bytes) -> None:
            if not self._edge_discard:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self._edge_discard:
                return
            super().on_message_complete()
            self._edge_in_head = True
            self._edge_reading_body = False
            self._edge_disarm()
            if self._edge_fast is not None:
                self._edge_start_fast()

        def _edge_start_fast(self) -> None:
            cycle, self._edge_fast = self._edge_fast, None
            assert fast_serve is not None
            self._start_asgi_task(cycle, fast_serve)

        def _edge_arm(self, delay_s: float) -> None:
            # two deadlines per request (headers, then body): entries in a shared queue per
            # duration, one loop timer each (deadlines.py), not a timer handle per arm
            self._edge_disarm()
            queue = deadlines.queue(delay_s)
            self._edge_timer = (queue, queue.add(self._edge_expired))

        def _edge_disarm(self) -> None:
            timer = self._edge_timer
            if timer is not None:
                timer[0].cancel(timer[1])
                self._edge_timer = None

        def _edge_expired(self) -> None:
            self._edge_timer = None
            if self.transport.is_closing():
                return
            cycle: Any = self.cycle
            if self._edge_reading_body and cycle is not None:
                if cycle.response_started:
                    return  # the handler answered without the whole body: its business
                # the handler waits in receive(): it sees a disconnect, its answer goes nowhere
                cycle.disconnected = True
                cycle.message_event.set()
                self.transport.write(slow_body)
            else:
                self.transport.write(slow_headers)
            self.transport.close()

    return EdgeProtocol
