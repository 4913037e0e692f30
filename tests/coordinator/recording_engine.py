"""A recording HTTP hop in front of a real simulated engine: what did the engine receive?

Security tests must assert on what reached an engine, not on the client's status code, so
each engine of the fleet sits behind this hop: every request is recorded (method, path,
headers, JSON body) and forwarded unchanged to a real `SimServer`, whose answer goes back
unchanged (bodies read whole: the tests using it send non-streamed requests).

    async with recording_engine(role="decode") as engine:
        engine.url         # put this in the fleet file as a static endpoint
        engine.received    # [Received(method, path, headers, body), ...]
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pools.http_client import http_client
from pools.inloop_server import InLoopHttpServer
from pools.sim.server import SimServer
from pools.sim.settings import SimEngineSettings
from tests.coordinator.helpers import MODEL

_HOP = {"content-length", "transfer-encoding", "connection", "host"}


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class RecordingEngine:
    url: str
    received: list[Received] = field(default_factory=list)

    def completions(self) -> list[Received]:
        return [r for r in self.received if r.path.endswith("/completions")]


@asynccontextmanager
async def recording_engine(role: str) -> AsyncIterator[RecordingEngine]:
    settings = SimEngineSettings.model_validate(
        {
            "port": 0,
            "role": role,
            "time_scale": 0.01,
            "kv_transport": "tcp",
            "served_model_name": MODEL,
            "model_profile": "llama-3.1-8b",
        }
    )
    engine = SimServer(settings)
    target = await engine.start()
    record = RecordingEngine(url="")
    async with http_client(base_url=target, timeout=30.0) as upstream:

        async def forward(request: Request) -> Response:
            raw = await request.body()
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw
            record.received.append(
                Received(request.method, request.url.path, dict(request.headers), body)
            )
            headers = {k: v for k, v in request.headers.items() if k not in _HOP}
            try:
                answer = await upstream.request(
                    request.method,
                    request.url.path,
                    content=raw,
                    headers=headers,
                    params=request.query_params,
                )
            except httpx.HTTPError as err:
                return Response(str(err), status_code=502)
            out = {k: v for k, v in answer.headers.items() if k not in _HOP}
            out.pop("content-encoding", None)
            return Response(answer.content, status_code=answer.status_code, headers=out)

        methods = ["GET", "POST", "PUT", "DELETE"]
        app = Starlette(routes=[Route("/{path:path}", forward, methods=methods)])
        server = InLoopHttpServer(app, "127.0.0.1", 0)
        record.url = await server.start()
        try:
            yield record
        finally:
            await server.stop()
            await engine.stop()
