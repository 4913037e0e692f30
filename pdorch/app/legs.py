"""The upstream HTTP legs of one request, on the coordinator's shared `httpx.AsyncClient`.

- `prefill_leg`: POST the prefill body (`pools.pd_protocol.prefill_leg_body`), read the JSON,
  return its `kv_transfer_params`. Any failure (connection, timeout, 5xx, 4xx, no params) is a
  `LegFailure`: the caller lets the decode replica prefill locally.
- `open_decode_stream`: POST the decode body and read up to the *first chunk* of the answer.
  Until that chunk, nothing was sent to the client, so a failure (`LegFailure`) can still be
  retried on another decode replica; a 4xx answer is the client's fault and comes back as
  `UpstreamAnswer` to pass through unchanged.
- `decode_whole`: the same for non-streamed requests, reading the whole body.

`LegFailure.reached` says whether the engine may have seen the request: a refused connection
(`httpx.ConnectError`) means it did not, so the prefill's KV blocks are still unclaimed and
a retry can reuse `kv_transfer_params`; after anything else they may be gone.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from pools.fleet import FailureKind
from pools.health import classify_error
from pools.pd_protocol import kv_transfer_params_of

_decode_json = msgspec.json.Decoder().decode
JSON_HEADERS = {"content-type": "application/json"}


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
    reached = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
    return LegFailure(classify_error(exc), f"{type(exc).__name__}: {exc}", reached=reached)


async def prefill_leg(
    client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str]
) -> dict[str, Any]:
    """Run the prefill leg; its `kv_transfer_params` or `LegFailure`."""
    try:
        response = await client.post(url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        raise _failure(exc) from None
    if response.status_code != 200:
        kind = FailureKind.HTTP_5XX if response.status_code >= 500 else None
        raise LegFailure(
            kind,
            f"prefill answered {response.status_code}: {response.text[:300]}",
            status=response.status_code,
        )
    try:
        return kv_transfer_params_of(_decode_json(response.content))
    except (msgspec.DecodeError, ValueError, AttributeError) as exc:
        raise LegFailure(None, f"prefill answer unusable: {exc}", status=200) from None


@dataclass(slots=True)
class DecodeStream:
    """An open decode answer: its first chunk, and the rest to forward."""

    response: httpx.Response
    first: bytes
    rest: AsyncIterator[bytes]

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self.response.aclose()


async def _send(
    client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str]
) -> httpx.Response:
    request = client.build_request("POST", url, content=body, headers=headers)
    try:
        response = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise _failure(exc) from None
    if response.status_code == 200:
        return response
    try:
        content = await response.aread()
    except httpx.HTTPError as exc:
        raise _failure(exc) from None
    finally:
        await response.aclose()
    if response.status_code >= 500:
        raise LegFailure(
            FailureKind.HTTP_5XX,
            f"decode answered {response.status_code}: {content[:300]!r}",
            status=response.status_code,
        )
    raise UpstreamAnswer(
        response.status_code,
        content,
        response.headers.get("content-type", "application/json"),
    )


async def open_decode_stream(
    client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str]
) -> DecodeStream:
    """Send the decode leg and wait for its first chunk (see the module docstring)."""
    response = await _send(client, url, body, headers)
    try:
        rest = response.aiter_raw()
        try:
            first = await anext(rest)
        except StopAsyncIteration:
            raise LegFailure(FailureKind.HTTP_5XX, "decode answered 200 with no body") from None
        except httpx.HTTPError as exc:
            raise _failure(exc) from None
    except BaseException:
        await response.aclose()
        raise
    return DecodeStream(response, first, rest)


async def decode_whole(
    client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str]
) -> tuple[bytes, str]:
    """Send a non-streamed decode leg and read its whole answer (content, content type)."""
    response = await _send(client, url, body, headers)
    try:
        content = await response.aread()
    except httpx.HTTPError as exc:
        raise _failure(exc) from None
    finally:
        await response.aclose()
    return content, response.headers.get("content-type", "application/json")
