"""`ProxyStream`: the decode engine's SSE answer relayed to the client, continued on another
decode replica when its engine fails mid-stream (`migration.py`).

The relay, per chunk: count the `data:` events (token load: `lifecycle.tokens`), forward.
When the request may migrate (`RequestFlow.trail`), only complete events go out and their
token ids are read (`StreamTrail`); otherwise the bytes go out as read.

Failures after the first byte, each reported to health as an engine fault
(`Coordinator.report_failure`) and counted in `pdorch_migrations_total{reason}`:
- `connection`: a read error (reset, refused, timed out: `pools.health.classify_error`);
- `eof`: the answer ended before `[DONE]` (FailureKind.CONNECTION);
- `error_event`: an in-band `data: {"error": ...}` event after the first byte (migratable
  streams only: their events are read whole). The simulated engine and vLLM end their open
  streams that way when they stop (SIGTERM: the sim fails every open request with "engine
  stopped"; vLLM's generators catch the dead engine's error and send the error event, then
  `[DONE]`): before, the relay passed it on as the answer's end. Not reported to health (the
  error may be the request's own; a stopping engine's `/health` ejects it); a request whose
  every continuation errors ends once `migration_limit` is reached.
- `stall`: no byte for `stall_timeout_s` while we wait on the engine (FailureKind.TIMEOUT).
  A lazy watchdog: one timer per stream, re-armed only when it fires before the deadline (the
  chunk loop only stores the loop time of each chunk), then it closes the upstream answer,
  which ends the read. Time spent handing a chunk to a slow client (suspended in `yield`,
  the client's TCP window full) does not count: the engine is not silent, we do not read.
Then, while `migration_limit` allows and `lifecycle.migrate` finds a replica, the continuation
(`continuation_body`) is sent to it as a local leg; its first byte must come within
`prefill_timeout_s` (it prefills prompt + output), else that try counts as a `stall` and the
next replica is tried. Its events are rewritten into the original stream (`Continuation`).
When no continuation is possible (limit reached, no replica left, not migratable, cut by a
drain) the stream ends with an OpenAI error event and `data: [DONE]`, so a client never
hangs or gets a silently truncated stream.

Whatever ends it (last byte, failure, client disconnect), `__call__`'s `finally` closes the
upstream answer and releases the request. Response headers name the first decode replica
(they were sent before any migration).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from pdorch.app.deadlines import Cut
from pdorch.app.disconnect import watch_disconnect
from pdorch.app.errors import error_event
from pdorch.app.legs import DecodeStream, LegFailure, UpstreamAnswer, open_decode_stream
from pdorch.app.migration import COMPLETIONS_PATH, Continuation, continuation_body
from pools.fleet import FailureKind
from pools.health import classify_error
from pools.pd_protocol import REQUEST_ID_HEADER

if TYPE_CHECKING:
    from pdorch.app.flow import RequestFlow
    from pdorch.app.openai_schema import ParsedRequest

log = logging.getLogger(__name__)
_encode = msgspec.json.Encoder().encode
_DONE = b"data: [DONE]\n\n"


def _usage_events(parsed: ParsedRequest) -> int:
    """1 when the stream ends with a usage event (`stream_options.include_usage`), else 0."""
    options = parsed.body.get("stream_options")
    return int(isinstance(options, dict) and bool(options.get("include_usage")))


class _Failed(Exception):
    """The current decode leg failed mid-stream (`reason`, `kind`, `replica`, `detail`)."""

    def __init__(self, reason: str, kind: FailureKind | None, replica: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.kind = kind
        self.replica = replica
        self.detail = detail


class _EndedWithError(Exception):
    """The engine ended the leg with an in-band error event (`event`), not sent on."""

    def __init__(self, event: bytes) -> None:
        super().__init__()
        self.event = event


_ERROR_EVENT = b'data: {"error"'
_TAIL = len(_DONE) * 2  # enough of the stream's end to see `[DONE]` split across reads


def _tail(tail: bytes, chunk: bytes) -> bytes:
    """The stream's last bytes after `chunk` (at least `_TAIL` of them; no copy of a long
    chunk: `[DONE]` and the event separator are read from its end)."""
    return chunk if len(chunk) >= _TAIL else (tail + chunk)[-_TAIL:]


def _split_error(events: bytes) -> tuple[bytes, bytes | None]:
    """(the complete events before an in-band error event, that event and what follows, or
    None). vLLM and the simulated engine both write `data: {"error"...` (a token's text
    cannot: its quotes are escaped)."""
    at = events.find(_ERROR_EVENT)
    if at < 0:
        return events, None
    return events[:at], events[at:]


class ProxyStream(StreamingResponse):
    """The streamed answer of one request (see the module docstring)."""

    def __init__(self, flow: RequestFlow, stream: DecodeStream, replica_id: str, pool: str) -> None:
        self.flow = flow
        self.stream = stream
        self.replica_id = replica_id
        self.pool = pool
        self.completed = False
        self.errored = False
        self.stalled = False
        self.migrations = 0
        self._stall_s = flow.c.settings.stall_timeout_s
        self._last_byte = 0.0
        self._in_yield = False  # suspended in `yield` (the client reads slowly): no stall
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        flow.stream = self
        super().__init__(
            self._body(),
            status_code=200,
            media_type="text/event-stream",
            headers={**flow.route_headers(), "cache-control": "no-cache"},
        )

    # ---- the relay ---------------------------------------------------------------------------

    async def _body(self) -> AsyncIterator[bytes]:
        flow = self.flow
        c = flow.c
        rid = flow.request_id
        lifecycle = c.lifecycle
        trail = flow.trail
        rewrite: Continuation | None = None
        sent = 0  # events the client got
        first_at = last_at = c.now()
        first_sent = 0
        tail = b""
        while True:
            # the first chunk of this leg (the decode leg's, or a continuation's)
            chunk = self.stream.first
            events = chunk.count(b"data: ")  # events of this leg: its token load
            lifecycle.tokens(rid, c.now(), events)
            out = chunk if trail is None else (rewrite or trail).feed(chunk)
            ended = None  # an in-band error event that ends this leg (migratable streams)
            if trail is not None:
                out, ended = _split_error(out)
            if out:
                sent += out.count(b"data: ")
                tail = _tail(tail, out)
                if not first_sent:
                    first_sent = sent
                yield out
            self._arm_stall()
            try:
                try:
                    if ended is not None:
                        raise _EndedWithError(ended)
                    loop_time = self._clock()
                    async for chunk in self.stream.rest:
                        if not chunk:
                            continue
                        self._last_byte = loop_time()
                        events += chunk.count(b"data: ")
                        last_at = c.now()
                        lifecycle.tokens(rid, last_at, events)
                        if trail is not None:
                            chunk = (rewrite or trail).feed(chunk)
                            chunk, ended = _split_error(chunk)
                            if ended is not None:
                                if chunk:
                                    sent += chunk.count(b"data: ")
                                    tail = _tail(tail, chunk)
                                    yield chunk
                                raise _EndedWithError(ended)
                            if not chunk:
                                continue
                            sent += chunk.count(b"data: ")
                        else:
                            sent = events
                        tail = _tail(tail, chunk)
                        # a slow client holds us here: that time is not the engine's silence
                        self._in_yield = True
                        yield chunk
                        self._in_yield = False
                        self._last_byte = loop_time()
                except _EndedWithError as err:
                    raise self._error_failure(err.event) from None
                except Exception as exc:  # read/payload errors (either client): died, hung or cut
                    raise self._failure(exc) from None
                finally:
                    self._disarm_stall()
                if tail.endswith(_DONE):
                    self.completed = True
                    self._observe(sent, sent - first_sent, last_at - first_at)
                    return
                raise self._failure(None)
            except _Failed as failed:
                if flow.cut_reason is not None:
                    yield self._error_end(tail, f"stream ended early: {flow.cut_reason}")
                    return
                if failed.kind is not None:
                    c.report_failure(failed.replica, failed.kind, f"mid-stream: {failed.detail}")
                why = await self._continue(failed)
                if why is not None:
                    yield self._error_end(
                        tail,
                        f"decode replica {failed.replica} failed mid-stream ({failed.detail}); "
                        f"not continued: {why}",
                    )
                    return
                assert trail is not None and flow.parsed is not None
                rewrite = Continuation(flow.parsed, trail)

    def _failure(self, exc: Exception | None) -> _Failed:
        at = self.replica_id
        if self.stalled:
            self.stalled = False
            return _Failed(
                "stall", FailureKind.TIMEOUT, at, f"no byte for stall_timeout_s={self._stall_s:g}"
            )
        if exc is None:
            return _Failed("eof", FailureKind.CONNECTION, at, "the stream ended before [DONE]")
        return _Failed("connection", classify_error(exc), at, repr(exc))

    def _error_failure(self, event: bytes) -> _Failed:
        """An in-band error event after the first byte: continued like an EOF, but not
        reported to health (it may be this request's own error; a stopping engine's
        `/health` ejects it anyway). A request-specific error fails again on the next
        replica and ends the stream once `migration_limit` is reached."""
        detail = event[:200].decode("utf-8", errors="replace").strip()
        return _Failed("error_event", None, self.replica_id, f"in-band error event: {detail}")

    async def _continue(self, failed: _Failed) -> str | None:
        """Continue on another replica (`self.stream` is then the continuation); None when it
        goes on, else why not (the refusal is counted)."""
        flow = self.flow
        c = flow.c
        refused = c.metrics.migrations_refused
        trail = flow.trail
        parsed = flow.parsed
        assert parsed is not None
        reason = failed.reason
        with contextlib.suppress(Exception):
            await self.stream.aclose()
        if trail is None:
            refused.labels("not_migratable").inc()
            return f"the request cannot be continued elsewhere ({flow.not_migratable})"
        limit = c.settings.migration_limit
        while True:
            if self.migrations >= limit:
                refused.labels("limit").inc()
                return f"migration_limit={limit} reached"
            body = continuation_body(parsed, trail)
            if body is None:
                refused.labels("not_migratable").inc()
                return "no token ids to continue from, or no tokens left to generate"
            trail.pending = b""  # a half-sent event of the failed leg is dropped
            generated = len(trail.output_ids) - flow.carried
            leg = c.lifecycle.migrate(flow.request_id, c.now(), generated)
            flow.carried = len(trail.output_ids)
            flow.untrack(self.replica_id)
            if leg is None:
                refused.labels("no_replica").inc()
                return "no healthy decode replica left"
            self.migrations += 1
            c.metrics.migrations.labels(reason).inc()
            flow.track(leg.replica)
            replica = c.replica(leg.replica)
            self.replica_id = leg.replica
            if replica is None:
                reason = "connection"
                continue
            headers = {**flow.headers, REQUEST_ID_HEADER: f"{flow.request_id}-m{self.migrations}"}
            log.info(
                "request %s: continuing on %s after %s (%d tokens streamed)",
                flow.request_id,
                leg.replica,
                reason,
                len(trail.output_ids),
            )
            try:
                async with Cut(c.deadlines.queue(c.settings.prefill_timeout_s)):
                    stream = await open_decode_stream(
                        c.legs,
                        replica.url + COMPLETIONS_PATH,
                        _encode(body),
                        headers,
                        c.stream_timeout,
                    )
            except TimeoutError:
                reason = "stall"
                c.report_failure(leg.replica, FailureKind.TIMEOUT, "continuation: no first byte")
                continue
            except UpstreamAnswer as answer:
                refused.labels("not_migratable").inc()
                text = answer.content[:200].decode("utf-8", errors="replace")
                return f"{leg.replica} refused the continuation ({answer.status}: {text})"
            except LegFailure as failure:
                reason = "connection"
                if failure.kind is not None:
                    c.report_failure(leg.replica, failure.kind, f"continuation: {failure.detail}")
                continue
            c.report_success(leg.replica)
            self.pool = replica.pool
            self.stream = stream
            return None

    # ---- stall watchdog ----------------------------------------------------------------------

    def _clock(self) -> Callable[[], float]:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop.time

    def _now(self) -> float:
        return self._clock()()

    def _arm_stall(self) -> None:
        self._last_byte = self._now()
        assert self._loop is not None
        self._timer = self._loop.call_later(self._stall_s, self._stall_check)

    def _disarm_stall(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _stall_check(self) -> None:
        if self._timer is None or self._loop is None:
            return
        left = self._last_byte + self._stall_s - self._loop.time()
        if self._in_yield:  # waiting on the client, not on the engine
            left = self._stall_s
        if left > 0:  # bytes came since the timer was set: wait for the rest of the window
            self._timer = self._loop.call_later(left, self._stall_check)
            return
        self._timer = None
        self.stalled = True
        self.stream.close()  # the chunk loop's read ends with an error

    # ---- ends --------------------------------------------------------------------------------

    def cut(self) -> None:
        """Close the upstream answer: the body loop ends and sends the error event."""
        self.stream.close()

    def _observe(self, events: int, later_events: int, span_s: float) -> None:
        """Per completed stream: output tokens and the mean gap between token events."""
        flow = self.flow
        metrics = flow.c.metrics
        assert flow.parsed is not None
        # one token per SSE event (vLLM without speculative decoding), less the events that
        # carry none: [DONE], chat's opening role event, the usage event
        usage = _usage_events(flow.parsed)
        tokens = max(0, events - 1 - usage - (flow.parsed.kind == "chat"))
        metrics.completed(flow.route_kind, tokens)
        gaps = later_events - 1 - usage  # token events after the first chunk
        if gaps > 0 and span_s > 0:
            metrics.stream_itl(self.pool, self.replica_id, span_s / gaps)

    def _error_end(self, tail: bytes, message: str) -> bytes:
        self.flow.c.metrics.stream_errors.inc()
        self.errored = True
        sep = b"" if tail.endswith(b"\n\n") or not tail else b"\n\n"
        return sep + error_event(message)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the events as the relay yields them, one ASGI body message each (one socket
        write per upstream read); a client that leaves cancels the relay at its next await.

        Not Starlette's `StreamingResponse.__call__`: under ASGI spec < 2.4 (uvicorn says
        2.3) it runs the body in an anyio task group beside a disconnect listener, per
        stream; here the client's disconnect (`disconnect.py`: told by the edge, else one plain task
        waiting for it) cancels this one."""
        task = asyncio.current_task()
        assert task is not None
        left = False

        def client_left() -> None:
            nonlocal left
            left = True
            task.cancel()

        watch = watch_disconnect(scope, receive, client_left)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not left or task.uncancel() > 0:  # not (only) ours: pass it on
                raise
        finally:
            watch.stop()
            await self._close()

    async def close_unsent(self) -> None:
        """Close a stream never handed to the ASGI server itself (`fanout.py` relays its body
        into a batch's merged stream): the same ending as `__call__`'s."""
        await self._close()

    async def _close(self) -> None:
        self._disarm_stall()
        body = self.body_iterator
        aclose: Callable[[], Awaitable[Any]] | None = getattr(body, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
        await self.stream.aclose()
        if not self.completed and not self.errored:
            self.flow.c.metrics.disconnects.inc()
        self.flow._finish(ok=self.completed, status=200)
