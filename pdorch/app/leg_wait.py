"""The waiting parts of a request's flow (`flow.py`): its body from the client, a decode leg
up to its first byte, and the output tokens of a whole answer (the client's disconnect:
`disconnect.py`).

Split from `flow.py` (issue 15 code health: one module per job, below ~500 lines); the flow
reads the same as before, these are its I/O waits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from starlette.requests import Request
from starlette.types import Receive

from pdorch.app.deadlines import Cut
from pdorch.app.errors import ApiError
from pdorch.app.legs import LegFailure
from pools.fleet import FailureKind
from pools.replica import ReplicaState

if TYPE_CHECKING:
    from pdorch.app.state import Coordinator

_T = TypeVar("_T")


class ClientGone(Exception):
    """The client disconnected while the legs ran."""


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, 413 past `limit` bytes (checked on Content-Length and while reading).

    Read from the ASGI `receive` directly, not through starlette's `Request.stream()` (an
    async generator, and a `Headers` object built for the one Content-Length lookup): ~10 µs
    of the ~15 µs this took per request (proxy-9). Same messages, same errors: a disconnect
    mid-body is `ClientGone`."""
    cached = getattr(request, "_body", None)  # read already (`Request.body()`): as stream()
    if isinstance(cached, bytes):
        _check_length(request.scope["headers"], limit)
        if len(cached) > limit:
            raise body_too_large(limit)
        return cached
    return await read_asgi_body(request.scope["headers"], request.receive, limit)


def body_too_large(limit: int) -> ApiError:
    """The 413 of a body over `limit` bytes (one copy: ASGI, edge and replayed bodies)."""
    return ApiError(413, f"Request body over {limit} bytes.", code="request_too_large")


def _check_length(headers: list[tuple[bytes, bytes]], limit: int) -> None:
    length = _content_length(headers)
    if length is not None and length.isdigit() and int(length) > limit:
        raise body_too_large(limit)


async def read_asgi_body(headers: list[tuple[bytes, bytes]], receive: Receive, limit: int) -> bytes:
    """`read_body` of an ASGI request's raw `headers` and `receive` (`edge_request.py`)."""
    _check_length(headers, limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.disconnect":  # left (or cut at body_timeout_s, edge.py) mid-body
            raise ClientGone()
        if kind != "http.request":
            continue
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise body_too_large(limit)
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _content_length(raw: list[tuple[bytes, bytes]]) -> str | None:
    """The first Content-Length of the raw ASGI headers (as starlette's `Headers.get`)."""
    for name, value in raw:
        if name == b"content-length":
            return value.decode("latin-1")
    return None


async def until_first_byte(
    c: Coordinator,
    request_id: str,
    replica_id: str,
    leg: Awaitable[_T],
    deadline_s: float | None,
    can_move: Callable[[], bool],
) -> _T:
    """Run a decode leg up to its first byte (a stream's first chunk; a non-streamed
    answer's whole body). The leg is given up, a `LegFailure` that the flow retries on
    another replica (`decode_attempts.py`), when the health checker finds the replica
    unhealthy meanwhile (`Coordinator.waiting_legs`: a hung engine sends no byte, no reset;
    kind TIMEOUT), or already is when the leg starts (ejected after the routing decision), or,
    for a stream, past `deadline_s` (`first_byte_timeout_s`; no health kind: a slow
    engine is not a dead one, the probes judge it). Either only when `can_move()` (a
    retry is allowed and another replica is routable): otherwise waiting is the better
    bet (a starved box can eject a healthy replica on a late probe). A non-streamed
    answer gets no deadline: its only byte comes at its end."""
    why: list[str] = []
    hung = Cut(None)  # a cancel scope without a deadline of its own (deadlines.py)

    def give_up(reason: str) -> None:
        if why or not can_move():
            return
        why.append(reason)
        hung.fire()  # the block below is cancelled at its next wait

    def past_deadline() -> None:
        give_up("")

    queue = None if deadline_s is None else c.deadlines.queue(deadline_s)
    timer = None if queue is None else queue.add(past_deadline)
    try:
        async with hung:
            c.waiting_legs.begin(replica_id, request_id, give_up)
            # ejected since it was routed (during the prefill leg, say): the hang-up at the
            # ejection came before this leg waited, so it would wait on a hung engine for good
            replica = c.replica(replica_id)
            if replica is not None and replica.state is ReplicaState.UNHEALTHY:
                give_up("ejected before the leg began")
            try:
                return await leg
            finally:
                c.waiting_legs.end(replica_id, request_id)
    except TimeoutError:
        if not why:
            raise
        if why[0]:
            c.metrics.first_byte_failures.labels("unhealthy").inc()
            raise LegFailure(
                FailureKind.TIMEOUT,
                f"the replica turned unhealthy while the leg waited ({why[0]})",
            ) from None
        c.metrics.first_byte_failures.labels("deadline").inc()
        raise LegFailure(
            None, f"no first byte within first_byte_timeout_s={deadline_s:g}"
        ) from None
    finally:
        if queue is not None and timer is not None:
            queue.cancel(timer)


_USAGE_KEY = b'"completion_tokens":'


def completion_tokens(content: bytes) -> int | None:
    """`usage.completion_tokens` of a whole answer, found from the end (no JSON decode)."""
    at = content.rfind(_USAGE_KEY)
    if at < 0:
        return None
    digits = content[at + len(_USAGE_KEY) : at + len(_USAGE_KEY) + 12].lstrip()
    end = 0
    while end < len(digits) and 48 <= digits[end] <= 57:
        end += 1
    return int(digits[:end]) if end else None
