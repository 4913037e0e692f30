"""The upstream HTTP legs of one request, on the coordinator's leg client (`Coordinator.legs`):
an `aiohttp.ClientSession` (`pdorch/app/upstream.py`: connector and timeout settings) or the
`NativeLegClient` (`pdorch/app/leg_client.py`), as `coordinator.leg_client` says. Both give the
same answers, failures and kinds; each function below has one branch per client.

- `prefill_leg`: POST the prefill body (`pools.pd_protocol.prefill_leg_body`), read the JSON,
  check its `kv_transfer_params` (`transfer.KvTransferParams.parse`: usable for a remote
  prefill) and return them as JSON bytes, the engine's object as it sent it (the decode leg
  splices them in, `leg_bytes.py`: no pydantic `wire()` per request). Any failure (connection,
  timeout, 5xx, 4xx, no or bad params) is a `LegFailure`: the caller lets the decode replica
  prefill locally.
- `open_decode_stream`: POST the decode body and read up to the *first chunk* of the answer.
  Until that chunk, nothing was sent to the client, so a failure (`LegFailure`) can still be
  retried on another decode replica; a 4xx answer is the client's fault and comes back as
  `UpstreamAnswer` to pass through unchanged. A first chunk that is an SSE error event (vLLM
  streams a failed KV load as 200 + `data: {"error": ...}`) is a `LegFailure` too, with no
  health kind (the KV source failed, not this replica): the retry prefills locally.
- `decode_whole`: the same for non-streamed requests, reading the whole body.

`LegFailure.reached` says whether the engine may have seen the request: a refused or timed-out
connection (`aiohttp.ClientConnectorError`, `aiohttp.ConnectionTimeoutError`; the native
client's `LegConnectError`/`LegConnectTimeout`; httpx's `ConnectError`/`ConnectTimeout`)
means it did not, so the prefill's KV blocks are still
unclaimed and a retry can reuse `kv_transfer_params`; after anything else they may be gone.

Bytes: answers are read raw (`auto_decompress=False`, no `Accept-Encoding` sent), so what the
engine sent is what the client gets. Closing: a fully read answer returns its connection to the
pool; one closed early (client gone, failure) closes the connection, so the engine sees the
disconnect and aborts the request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import httpx
import msgspec

from pdorch.app.leg_client import NativeLegClient
from pdorch.app.leg_errors import LegClientError, LegConnectError, LegConnectTimeout
from pdorch.app.leg_response import LegResponse
from pools.fleet import FailureKind
from pools.health import classify_error
from pools.pd_protocol import kv_transfer_params_of

_decode_json = msgspec.json.Decoder().decode


class _PrefillAnswer(msgspec.Struct):
    """What the flow reads of a prefill answer: its `kv_transfer_params`, unparsed."""

    kv_transfer_params: msgspec.Raw = msgspec.Raw(b"null")  # absent: as a JSON null


_decode_prefill = msgspec.json.Decoder(_PrefillAnswer).decode
JSON_HEADERS = {"content-type": "application/json"}
# what the leg functions turn into `LegFailure` (aiohttp's timeouts are `TimeoutError`s)
UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError, LegClientError)
_NOT_REACHED = (
    aiohttp.ClientConnectorError,
    aiohttp.ConnectionTimeoutError,
    LegConnectError,
    LegConnectTimeout,
    httpx.ConnectError,
    httpx.ConnectTimeout,
)
# the coordinator's leg client, either kind (`Coordinator.legs`)
LegSession = aiohttp.ClientSession | NativeLegClient
Answer = aiohttp.ClientResponse | LegResponse


class LegFailure(Exception):
    """A leg failed in a way that is the engine's fault (or unknown)."""

    def __init__(
        self, kind: FailureKind | None, detail: str, *, reached: bool = True, status: int = 0
    ) -> None:
        super().__init__(detail)
        self.kind = kind  # None: not a health signal (a 4xx or missing params)
        self.detail = detail
        self.reached = reached
        self.status = status

    @property
    def label(self) -> str:
        return self.kind.value if self.kind is not None else "bad_answer"


@dataclass(slots=True)
class UpstreamAnswer(Exception):
    """An engine's non-200, non-5xx answer, passed through to the client unchanged."""

    status: int
    content: bytes
    content_type: str


def _failure(exc: BaseException) -> LegFailure:
    reached = not isinstance(exc, _NOT_REACHED)
    return LegFailure(classify_error(exc), f"{type(exc).__name__}: {exc}", reached=reached)


def _content_type(response: aiohttp.ClientResponse) -> str:
    return response.headers.get("Content-Type", "application/json")


async def prefill_leg(session: LegSession, url: str, body: bytes, headers: dict[str, str]) -> bytes:
    """Run the prefill leg; its checked `kv_transfer_params` as JSON, or `LegFailure`."""
    try:
        if isinstance(session, NativeLegClient):
            native = await session.post(url, body, headers)
            try:
                status = native.status
                content = await native.read()
            finally:
                native.close()
        else:
            async with session.post(url, data=body, headers=headers) as response:
                status = response.status
                content = await response.read()
    except UPSTREAM_ERRORS as exc:
        raise _failure(exc) from None
    if status != 200:
        kind = FailureKind.HTTP_5XX if status >= 500 else None
        text = content[:300].decode("utf-8", errors="replace")
        raise LegFailure(kind, f"prefill answered {status}: {text}", status=status)
    try:
        # only the params are read (the rest of the answer is skipped, not built), and kept
        # as the bytes the engine sent: no re-encode for the decode leg's splice (proxy-9)
        wire = bytes(_decode_prefill(content).kv_transfer_params)
        kv_transfer_params_of({"kv_transfer_params": _decode_json(wire)})  # else ValueError
        return wire
    except (msgspec.DecodeError, ValueError, AttributeError) as exc:
        raise LegFailure(None, f"prefill answer unusable: {exc}", status=200) from None


def _close(response: Answer) -> None:
    """Back to the pool when fully read, else close the connection (the engine aborts)."""
    if isinstance(response, LegResponse):
        response.close()  # the native answer knows (`leg_response.py`)
    elif response.content.at_eof():
        response.release()
    else:
        response.close()


def _content_type_of(response: Answer) -> str:
    if isinstance(response, LegResponse):
        return response.content_type
    return _content_type(response)


@dataclass(slots=True)
class DecodeStream:
    """An open decode answer: its first chunk, and the rest to forward."""

    response: Answer
    first: bytes
    rest: AsyncIterator[bytes]

    def close(self) -> None:
        """Close the answer now (stall watchdog, drain cut): the pending read ends with an
        error."""
        self.response.close()

    async def aclose(self) -> None:
        _close(self.response)


async def _send(
    session: LegSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeouts: aiohttp.ClientTimeout | None,
) -> Answer:
    response: Answer
    try:
        if isinstance(session, NativeLegClient):  # no per-read timer: module docstring
            response = await session.post(url, body, headers)
        else:
            response = await session.post(
                url, data=body, headers=headers, timeout=timeouts or session.timeout
            )
    except UPSTREAM_ERRORS as exc:
        raise _failure(exc) from None
    status = response.status
    if status == 200:
        return response
    try:
        content = await response.read()
    except UPSTREAM_ERRORS as exc:
        raise _failure(exc) from None
    finally:
        _close(response)
    if status >= 500:
        raise LegFailure(
            FailureKind.HTTP_5XX, f"decode answered {status}: {content[:300]!r}", status=status
        )
    raise UpstreamAnswer(status, content, _content_type_of(response))


async def open_decode_stream(
    session: LegSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeouts: aiohttp.ClientTimeout | None = None,
) -> DecodeStream:
    """Send the decode leg and wait for its first chunk (see the module docstring).

    `timeouts`: the aiohttp leg's timeouts (`upstream.stream_timeout`: a read timeout between
    chunks); None: the session's. The native client has no per-read timer (the relay's stall
    watchdog bounds a stream)."""
    response = await _send(session, url, body, headers, timeouts)
    try:
        rest: AsyncIterator[bytes]
        rest = response if isinstance(response, LegResponse) else response.content.iter_any()
        try:
            first = await anext(rest)
        except StopAsyncIteration:
            raise LegFailure(FailureKind.HTTP_5XX, "decode answered 200 with no body") from None
        except UPSTREAM_ERRORS as exc:
            raise _failure(exc) from None
        if _is_error_event(first):
            # nothing reached the client yet: retried elsewhere, prefilling locally (no kind:
            # the usual cause is the KV source, a dead prefill engine, not this replica)
            raise LegFailure(
                None, f"decode answered an error event first: {first[:300]!r}", status=200
            )
    except BaseException:
        response.close()
        raise
    return DecodeStream(response, first, rest)


def _is_error_event(chunk: bytes) -> bool:
    """The chunk opens with an SSE `data: {"error": ...}` event (vLLM's in-stream error, e.g.
    a failed KV load under `kv_load_failure_policy: fail`)."""
    if not chunk.startswith(b"data:"):
        return False
    return chunk[5:].lstrip().startswith(b'{"error"')


async def decode_whole(
    session: LegSession, url: str, body: bytes, headers: dict[str, str]
) -> tuple[bytes, str]:
    """Send a non-streamed decode leg and read its whole answer (content, content type)."""
    response = await _send(session, url, body, headers, None)
    try:
        content = await response.read()
    except UPSTREAM_ERRORS as exc:
        raise _failure(exc) from None
    finally:
        _close(response)
    return content, _content_type_of(response)
