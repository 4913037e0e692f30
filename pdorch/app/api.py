"""The coordinator's HTTP app: OpenAI routes, health, metrics, admin.

`create_app(coordinator)` builds the app; the coordinator's lifecycle (start/stop)
belongs to whoever owns it (`pdorch.app.server`, tests, the proxy benchmark), so the same app
factory serves all of them.

Fast path: `POST /v1/completions` and `POST /v1/chat/completions` (the proxy's whole traffic)
skip the FastAPI/Starlette stack (exception middlewares, AsyncExitStack, router, dependency
solving: ~20% of the coordinator's CPU per request once the upstream legs are lean,
`benchmarks/results/proxy.md`) and go straight from the ASGI call to `RequestFlow`, which
never raises and answers every error itself. Same auth check, same error bodies, same
headers; any other method or path (405s, trailing-slash redirects, admin, docs) goes through
FastAPI as before. Under pdorch's edge with `coordinator.edge_fast_path` most of these POSTs do
not even come through ASGI: the edge calls `CoordinatorApp.serve_post`, the same request
logic, itself (`edge_fast.py`); the request as either reads it: `edge_request.py`.

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (stream or not; the P/D flow in
`flow.py`; batches of prompts `fanout.py`), `POST /tokenize`, `/detokenize`, `/v1/responses`,
`/v1/embeddings` (forwarded to one engine that serves them, `passthrough.py`), `GET /v1/models`
(the served model), `GET /health` (readiness: 200 when a decode or colocated
replica is routable and the KV-event join replay after start has ended, else 503 `no_replica`
or `replaying`), `GET /metrics` (Prometheus, `metrics.py`), `/admin/*`
(`admin.py`; both take `?model=NAME` in a several-model fleet, default the first model,
`models.py`), `GET /dashboard` (the status page, `dashboard.py`). Every error is OpenAI-shaped
(`errors.py`), including unknown routes (404),
wrong methods (405) and request validation (400: pdorch never answers 422). Headers past
`coordinator.max_header_bytes` (64 KiB) get 431 on every route. `GET /openapi.json` is the
hand-written description of every route (`openapi.py`: FastAPI's would miss the lean path and
every body); FastAPI's own docs and schema routes are off.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from pdorch.app.admin import admin_router
from pdorch.app.admin_drain import admin_drain_router
from pdorch.app.admin_scale import admin_scale_router
from pdorch.app.auth import check_client, check_client_authorization
from pdorch.app.dashboard import dashboard_router
from pdorch.app.edge_answer import write_answer
from pdorch.app.edge_request import AsgiRequest, ClientRequest, Replayed, authorization
from pdorch.app.errors import ApiError
from pdorch.app.flow import ClientGone, RequestFlow
from pdorch.app.metrics import CONTENT_TYPE
from pdorch.app.models import ModelDispatch, peek_model
from pdorch.app.openai_schema import RequestKind
from pdorch.app.openapi import openapi_document
from pdorch.app.passthrough import passthrough_router
from pdorch.app.state import Coordinator

_encode = msgspec.json.Encoder().encode
FAST_ROUTES: dict[str, RequestKind] = {
    "/v1/completions": "completion",
    "/v1/chat/completions": "chat",
}


async def serve_openai(c: Coordinator, kind: RequestKind, request: ClientRequest) -> Response:
    """One OpenAI POST: client auth, then the P/D flow (never raises `ApiError`)."""
    if c.api_keys:
        try:
            check_client_authorization(authorization(request.headers), c.api_keys)
        except ApiError as exc:
            if exc.status in (401, 403):
                c.metrics.rejected("auth")
            return exc.response()
    return await RequestFlow(c, kind, request).run()


async def serve_dispatched(
    models: ModelDispatch, kind: RequestKind, request: ClientRequest
) -> Response:
    """A several-model fleet (`models.py`): read the body, pick the model's coordinator by its
    `model`, and serve the request there with the body replayed."""
    primary = models.primary
    try:
        # before reading a stranger's body
        check_client_authorization(authorization(request.headers), primary.api_keys)
        raw = await request.body(primary.limits.max_body_bytes)
        chosen = models.pick(peek_model(raw))
    except ApiError as exc:
        if exc.status in (401, 403):
            primary.metrics.rejected("auth")
        return exc.response()
    except ClientGone:
        return Response(status_code=499)  # nobody reads it: the client left mid-body
    return await serve_openai(chosen, kind, Replayed(request, raw))


def model_cards(coordinators: list[Coordinator], created: int) -> list[dict[str, Any]]:
    """`/v1/models` data: each base model, then its loaded LoRA adapters with `parent` = the
    base model and `root` = the adapter's path, as vLLM lists them."""
    cards: list[dict[str, Any]] = []
    for c in coordinators:
        base = c.served_model
        cards.append(
            {
                "id": base,
                "object": "model",
                "created": created,
                "owned_by": "pdorch",
                "root": base,
                "parent": None,
            }
        )
        for adapter in c.adapters.known(base):
            cards.append(
                {
                    "id": adapter.name,
                    "object": "model",
                    "created": created,
                    "owned_by": "pdorch",
                    "root": adapter.root or adapter.name,
                    "parent": adapter.parent,
                }
            )
    return cards


def _header_bytes(scope: Scope) -> int:
    return sum(len(name) + len(value) for name, value in scope["headers"])


class CoordinatorApp(FastAPI):
    """FastAPI, with the two OpenAI POST routes served on a lean ASGI path (module docstring)."""

    coordinator: Coordinator
    models: ModelDispatch | None
    max_header_bytes: int

    async def serve_post(self, kind: RequestKind, request: ClientRequest) -> Response:
        """The request logic of the two OpenAI POSTs, whoever calls it: this app's lean ASGI
        branch, or pdorch's edge protocol directly (`edge.py`, `coordinator.edge_fast_path`)."""
        if self.models is not None:
            return await serve_dispatched(self.models, kind, request)
        return await serve_openai(self.coordinator, kind, request)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _header_bytes(scope) > self.max_header_bytes:
            # uvicorn's httptools parser buffers headers of any size: bound them here, for
            # every route, before any of it is decoded or logged
            limit = self.max_header_bytes
            too_big = ApiError(
                431, f"Request headers exceed {limit} bytes.", code="headers_too_large"
            )
            await too_big.response()(scope, receive, send)
            return
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and not scope.get("root_path")
            and (kind := FAST_ROUTES.get(scope["path"])) is not None
        ):
            response = await self.serve_post(kind, AsgiRequest(scope, receive))
            await write_answer(response, scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(coordinator: Coordinator, models: ModelDispatch | None = None) -> FastAPI:
    """The coordinator's ASGI app (see the module docstring). `models`: a several-model
    fleet's coordinators (`coordinator` is then its first, the one `/admin` and `/metrics`
    serve without `?model=`)."""
    c = coordinator
    app = CoordinatorApp(
        title="pdorch coordinator",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.coordinator = c
    app.models = models
    every = list(models.coordinators.values()) if models is not None else [c]
    app.max_header_bytes = c.settings.max_header_bytes
    app.state.coordinator = c

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        if exc.status in (401, 403):
            c.metrics.rejected("auth")
        return exc.response()

    @app.exception_handler(ClientGone)
    async def _client_gone(_: Request, exc: Exception) -> Response:
        return Response(status_code=499)  # nobody reads it: the client left mid-body

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        message = {404: "Not found.", 405: "Method not allowed."}.get(
            exc.status_code, str(exc.detail)
        )
        return ApiError(exc.status_code, f"{message}", code=None).response(dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return ApiError(400, f"{where}: {first.get('msg')}", param=where or None).response()

    # Registered for 405s, redirects and a root_path deployment; `CoordinatorApp.__call__`
    # serves the plain POSTs without entering FastAPI.
    async def serve(kind: RequestKind, request: Request) -> Response:
        return await app.serve_post(kind, AsgiRequest(request.scope, request.receive))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve("completion", request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve("chat", request)

    created = int(time.time())

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        check_client(request.headers, c.api_keys)
        body = {"object": "list", "data": model_cards(every, created)}
        return Response(_encode(body), media_type="application/json")

    @app.get("/health")
    async def health() -> Response:
        # readiness (the Kubernetes probe; liveness is the TCP port): not while the KV-event
        # join replay of a (re)started coordinator runs, its index is empty and routing
        # cache-blind until then (router/kv_event_subscriber.py, `replaying`)
        if not any(m.can_serve() for m in every):
            unavailable = ApiError(
                503, "No routable decode or colocated replica.", code="no_replica"
            )
            return unavailable.response()
        replaying = sorted(rid for m in every for rid in m.subscriber.replaying)
        if replaying:
            message = f"Rebuilding the KV index: join replay of {', '.join(replaying)} not ended."
            return ApiError(503, message, code="replaying").response()
        return Response(status_code=200)

    # `/admin/*` and `?model=` on `/metrics` pick a model's coordinator (`models.py`); a
    # one-model fleet gets a dispatch of its one coordinator for that, never on the POST path
    scope = models if models is not None else ModelDispatch([c])

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        chosen = scope.metrics_target(request) if request.query_params else c
        return Response(chosen.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/openapi.json")
    async def openapi() -> Response:
        # rendered per request: the `model` enums list every served name, adapters loaded at
        # run time included (a rare, cheap request)
        description = openapi_document(
            scope.names(), api_keys=bool(c.api_keys), admin_token=c.admin_token is not None
        )
        return Response(_encode(description), media_type="application/json")

    app.include_router(admin_router(scope))
    app.include_router(admin_scale_router(scope))
    app.include_router(admin_drain_router(scope))
    app.include_router(passthrough_router(c))
    app.include_router(dashboard_router(scope))  # /dashboard, /admin/dashboard.json
    return app
