"""Routes the coordinator forwards to one engine as they are: `POST /tokenize`, `/detokenize`,
`/v1/responses`, `/v1/embeddings`.

None of them is a P/D flow: `/tokenize` and `/detokenize` are the model's tokenizer (any
replica answers the same), `/v1/embeddings` needs an engine that serves a pooling model, and
`/v1/responses` is vLLM's Responses API (a generation the engine runs whole: its state, its
tool loop, its stream of typed events; splitting it into legs would need a P/D protocol of its
own). So each request goes to one healthy replica, the client's body and answer unchanged
(streamed answers relayed as they come).

Which replica: the routable ones, decode and colocated pools first (they generate), then any
other pool, in turn (a round-robin start per path, so one replica is not every tokenizer
call's). An engine that does not serve the route answers a plain 404/405 without an OpenAI
error body (vLLM registers `/v1/embeddings` only for pooling models, and FastAPI's own 404 is
`{"detail": "Not Found"}`): that replica is remembered as not serving the path (while it is in
the fleet) and the next one is tried. A connection failure also moves on. When none serves it: 404
`route_not_served`, naming the path. A model the coordinator does not serve is 404
`model_not_found`, as on the OpenAI routes.

Refused here (400 naming the param): `/v1/responses` with `previous_response_id` or
`background: true`. Both need the engine that stored the earlier response (vLLM keeps them
in its own memory), and pdorch does not route by stored responses.

Same auth as the OpenAI routes (`auth.check_client`), same body limit (413).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from pdorch.app.auth import check_client
from pdorch.app.errors import ApiError
from pdorch.app.flow import read_body
from pdorch.app.legs import UPSTREAM_ERRORS
from pdorch.app.state import Coordinator
from pools.replica import Replica

PATHS = ("/tokenize", "/detokenize", "/v1/responses", "/v1/embeddings")
_decode = msgspec.json.Decoder().decode
# fields of a path pdorch cannot serve (module docstring), with why
_REFUSED: dict[str, dict[str, str]] = {
    "/v1/responses": {
        "previous_response_id": "it needs the engine that stored that response",
        "background": "a background response is fetched later from the engine that ran it",
    },
}
_FIRST_POOLS = ("decode", "colocated")


def _check(body: Any, path: str, served_model: str) -> None:
    if not isinstance(body, dict):
        raise ApiError(400, "The body must be a JSON object.", code="invalid_json")
    model = body.get("model")
    if model is not None and model != served_model:
        raise ApiError(
            404,
            f"The model `{model}` does not exist (this endpoint serves `{served_model}`).",
            param="model",
            code="model_not_found",
        )
    for name, why in _REFUSED.get(path, {}).items():
        value = body.get(name)
        if value is not None and value is not False:
            raise ApiError(
                400, f"'{name}' is not supported by pdorch on {path}: {why}.", param=name
            )


def _route_missing(status: int, content: bytes) -> bool:
    """A plain 404/405 (no OpenAI error body): the engine has no such route."""
    if status not in (404, 405):
        return False
    try:
        answer = _decode(content)
    except msgspec.DecodeError:
        return True
    return not (isinstance(answer, dict) and isinstance(answer.get("error"), dict))


class Passthrough:
    """Forwards one of `PATHS` to a replica that serves it (module docstring)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.c = coordinator
        self.not_served: set[tuple[str, str]] = set()  # (replica id, path)
        self._turn = itertools.count()

    def candidates(self, path: str) -> list[Replica]:
        fleet = self.c.fleet
        # a replica that left the fleet is forgotten: its id may come back on another engine
        self.not_served = {key for key in self.not_served if key[0] in fleet}
        first = [r for p in _FIRST_POOLS for r in fleet.routable(p)]
        rest = [r for p in fleet.pools() if p not in _FIRST_POOLS for r in fleet.routable(p)]
        ordered = [r for r in first + rest if (r.replica_id, path) not in self.not_served]
        if ordered:
            start = next(self._turn) % len(ordered)
            ordered = ordered[start:] + ordered[:start]
        return ordered

    async def forward(self, request: Request, path: str) -> Response:
        c = self.c
        check_client(request.headers, c.api_keys)
        raw = await read_body(request, c.limits.max_body_bytes)
        try:
            body = _decode(raw)
        except (msgspec.DecodeError, RecursionError):
            raise ApiError(400, "The body is not valid JSON.", code="invalid_json") from None
        _check(body, path, c.served_model)
        headers = {"content-type": "application/json"}
        tried: list[str] = []
        for replica in self.candidates(path):
            try:
                response = await c.upstream.post(replica.url + path, data=raw, headers=headers)
            except UPSTREAM_ERRORS as exc:
                tried.append(f"{replica.replica_id}: {type(exc).__name__}")
                continue
            ctype = response.headers.get("Content-Type", "application/json")
            if response.status == 200 and ctype.startswith("text/event-stream"):
                return StreamingResponse(
                    _relay(response),
                    media_type="text/event-stream",
                    headers={"x-pdorch-replica": replica.replica_id},
                )
            try:
                content = await response.read()
            except UPSTREAM_ERRORS as exc:
                tried.append(f"{replica.replica_id}: {type(exc).__name__}")
                continue
            finally:
                response.release()
            if _route_missing(response.status, content):
                self.not_served.add((replica.replica_id, path))
                tried.append(f"{replica.replica_id}: does not serve {path}")
                continue
            return Response(
                content,
                status_code=response.status,
                media_type=ctype,
                headers={"x-pdorch-replica": replica.replica_id},
            )
        detail = "; ".join(tried) if tried else "no routable replica"
        raise ApiError(
            404, f"No replica of this fleet serves {path} ({detail}).", code="route_not_served"
        )


async def _relay(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.content.iter_any():
            yield chunk
    finally:
        with contextlib.suppress(Exception):
            response.close()


def passthrough_router(coordinator: Coordinator) -> APIRouter:
    """`POST` for each of `PATHS`, forwarded by one `Passthrough`."""
    router = APIRouter()
    forwarder = Passthrough(coordinator)

    def route(path: str) -> None:
        async def forward(request: Request) -> Response:
            return await forwarder.forward(request, path)

        router.add_api_route(path, forward, methods=["POST"], name=path)

    for path in PATHS:
        route(path)
    return router
