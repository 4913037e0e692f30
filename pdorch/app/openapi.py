"""The coordinator's OpenAPI 3.1 description, served at `GET /openapi.json`.

FastAPI cannot describe the coordinator: the two OpenAI POST routes bypass it (`api.py`'s lean
path) and every route reads its body itself (`openai_schema.py`, pydantic bodies of the admin
routes), so FastAPI would see no request bodies and invent 422s pdorch never sends. This module
writes the description by hand from the same rules, for one coordinator's configuration:

- `/v1/completions`, `/v1/chat/completions`: the fields the coordinator reads and checks, with
  the constraints `openai_schema.py` enforces (`model` must be the served model, else 404;
  `prompt` a non-empty string, token ids or a batch of up to `MAX_BATCH`; `messages` objects
  with a string `role`; `n` in 1..`MAX_CHOICES`; positive `max_tokens`); every other field
  travels to the engine unchanged (`additionalProperties: true`) and the engine's 400 passes
  through.
- `/tokenize`, `/detokenize`, `/v1/responses`, `/v1/embeddings` (forwarded to an engine,
  `passthrough.py`: the body an object, the engine's answer relayed);
- `/v1/models`, `/health`, `/metrics`, `/openapi.json` and every `/admin/*` route (bodies from
  the pydantic models the routes validate with, so the two cannot drift).
- Errors: every non-2xx answer is the OpenAI shape (`components.schemas.Error`, `errors.py`).
  Each operation lists the statuses it can answer: 400 validation, 401/403 (only when
  `api_keys` / `admin_token` are configured), 404, 408 (`edge.py` header/body deadlines), 409,
  413 (`max_body_bytes`), 429 (admission), 431 (`max_header_bytes`), 502/504 (engines,
  `request_timeout_s`), 503 (no replica, or `max_connections`).

`tests/coordinator/test_openapi.py` checks that every route the app serves is described and
nothing else is; `test_openapi_fuzz.py` runs schemathesis over it against a live coordinator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from pdorch.app.admin_drain import DrainBody
from pdorch.app.admin_scale import MoveBody, ScaleBody
from pdorch.app.openai_schema import MAX_BATCH, MAX_CHOICES
from pools.launch_spec import StaticEndpointSpec

OPENAPI_VERSION = "3.1.0"
_REF = "#/components/schemas/{model}"
_DESCRIPTIONS = {
    200: "OK.",
    201: "Created.",
    400: "Invalid request (bad JSON, a field of the wrong type or value); OpenAI error.",
    401: "Missing or unknown key / admin token.",
    403: "Wrong admin token, or a run-time replica address outside `replica_allow`.",
    404: "Unknown model, pool or replica.",
    408: "Headers or body not complete within `header_timeout_s` / `body_timeout_s`.",
    409: "Conflict (replica id taken; the fleet launches no engines; `fixed_fleet`: one of "
    "several `pdorch serve --workers` processes).",
    413: "Body over `max_body_bytes`.",
    422: "The engine refused the body (a forwarded route: relayed as the engine answered).",
    429: "Over the admission limit; `Retry-After` says when to try again.",
    431: "Headers over `max_header_bytes`.",
    502: "Every engine attempt failed.",
    503: "No routable replica, or over `max_connections`.",
    504: "No answer within `request_timeout_s`.",
}
# every route can answer these: the connection edge (edge.py) and the header limit (api.py)
_EDGE = (408, 431, 503)


def _error(status: int) -> dict[str, Any]:
    return {
        "description": _DESCRIPTIONS[status],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _ok(schema: dict[str, Any] | None, media: str = "application/json") -> dict[str, Any]:
    if schema is None:
        return {"description": "OK."}
    return {"description": "OK.", "content": {media: {"schema": schema}}}


def _responses(ok: dict[str, Any], statuses: tuple[int, ...], ok_status: int = 200) -> Any:
    out: dict[str, Any] = {str(ok_status): ok}
    for status in sorted(set(statuses) | set(_EDGE)):
        out[str(status)] = _error(status)
    return out


def _json_body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def _path_param(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "description": description,
    }


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _request_schemas(served_models: Sequence[str]) -> dict[str, Any]:
    token_ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
    text = {"type": "string", "minLength": 1}
    common: dict[str, Any] = {
        "model": {
            "type": "string",
            "enum": list(served_models),
            "description": "A served model or loaded adapter; any other name: 404 model_not_found.",
        },
        "stream": _nullable({"type": "boolean"}),
        "stream_options": _nullable({"type": "object"}),
        "max_tokens": _nullable({"type": "integer", "minimum": 1}),
        "n": _nullable(
            {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_CHOICES,
                "description": f"Choices per prompt; at most {MAX_CHOICES} choices in all "
                "(prompts x n).",
            }
        ),
        "kv_transfer_params": {"description": "Dropped: only the coordinator sets it."},
        "request_id": {"description": "Dropped: request ids upstream are the coordinator's."},
    }
    completion = {
        "type": "object",
        "description": "OpenAI completion request; fields not listed go to the engine as sent.",
        "required": ["model", "prompt"],
        "properties": {
            **common,
            "prompt": {
                "anyOf": [
                    text,
                    token_ids,
                    {"type": "array", "minItems": 1, "maxItems": MAX_BATCH, "items": text},
                    {"type": "array", "minItems": 1, "maxItems": MAX_BATCH, "items": token_ids},
                ],
                "description": f"A string, token ids, or a batch of up to {MAX_BATCH} of those "
                "(one P/D flow each, one merged answer).",
            },
        },
        "additionalProperties": True,
    }
    message = {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"type": "string"},
            "content": _nullable({"anyOf": [{"type": "string"}, {"type": "array"}]}),
        },
        "additionalProperties": True,
    }
    chat = {
        "type": "object",
        "description": "OpenAI chat request; fields not listed go to the engine as sent.",
        "required": ["model", "messages"],
        "properties": {
            **common,
            "messages": {"type": "array", "minItems": 1, "items": message},
            "max_completion_tokens": _nullable({"type": "integer", "minimum": 1}),
            "chat_template_kwargs": _nullable({"type": "object"}),
        },
        "additionalProperties": True,
    }
    return {"CompletionRequest": completion, "ChatCompletionRequest": chat}


def _error_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "integer", "null"]},
                },
            }
        },
    }


def _model_schemas(models: list[type[BaseModel]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=_REF)
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


def openapi_document(
    served_models: Sequence[str], *, api_keys: bool = False, admin_token: bool = False
) -> dict[str, Any]:
    """The description of every route for a coordinator serving `served_models` (each base
    model, then its adapters; the first is the one `?model=` defaults to and the passthrough
    routes serve); 401 (and 403 for admin) are listed where keys / an admin token are
    configured."""
    if not served_models:
        raise ValueError("an OpenAPI description needs at least one served model")
    served_model = served_models[0]
    client_auth: tuple[int, ...] = (401,) if api_keys else ()
    admin_auth: tuple[int, ...] = (401, 403) if admin_token else ()
    obj = {"type": "object"}
    sse = {  # one event: its `data` an answer chunk (JSON), an error, or the final [DONE]
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"type": "string"}},
        "description": "Server-sent events, ending with `data: [DONE]`.",
    }
    openai_errors = (*client_auth, 400, 404, 413, 429, 502, 504)

    def openai_op(summary: str, schema: str) -> dict[str, Any]:
        ok = {
            "description": "The answer; `text/event-stream` when `stream` is true.",
            "content": {"application/json": {"schema": obj}, "text/event-stream": {"schema": sse}},
        }
        op: dict[str, Any] = {
            "summary": summary,
            "requestBody": _json_body({"$ref": f"#/components/schemas/{schema}"}),
            "parameters": [
                {
                    "name": "x-pdorch-priority",
                    "in": "header",
                    "required": False,
                    # a hint, never a reason to refuse: a value that is no integer counts as 0
                    "schema": {"type": "string"},
                    "description": "Admission priority, an integer clamped to [-100, 100] "
                    "(larger first); missing or not an integer: 0.",
                }
            ],
            "responses": _responses(ok, openai_errors),
        }
        if api_keys:
            op["security"] = [{"ApiKey": []}]
        return op

    def passthrough_op(summary: str) -> dict[str, Any]:
        # passthrough.py: the body is the engine's to validate (a JSON object; `model`, when
        # given, the served one); the engine's answer, error or not, is relayed as it is
        body = {
            "type": "object",
            "properties": {"model": {"type": "string", "const": served_model}},
        }
        ok = {
            "description": "The engine's answer (`text/event-stream` when it streams).",
            "content": {"application/json": {"schema": obj}, "text/event-stream": {"schema": sse}},
        }
        op: dict[str, Any] = {
            "summary": summary,
            "requestBody": _json_body(body),
            "responses": _responses(ok, (*client_auth, 400, 404, 413, 422, 502)),
        }
        if api_keys:
            op["security"] = [{"ApiKey": []}]
        return op

    def admin_op(
        summary: str,
        statuses: tuple[int, ...] = (),
        body: dict[str, Any] | None = None,
        params: list[dict[str, Any]] | None = None,
        ok_status: int = 200,
    ) -> dict[str, Any]:
        op: dict[str, Any] = {
            "summary": summary,
            "tags": ["admin"],
            # 400: a query parameter other than `model`; 404: an unknown `?model=`
            "responses": _responses(
                _ok(obj), (*admin_auth, *dict.fromkeys((400, *statuses, 404))), ok_status
            ),
        }
        if body is not None:
            op["requestBody"] = body
        op["parameters"] = [*(params or ()), model_query]
        if admin_token:
            op["security"] = [{"AdminToken": []}]
        return op

    # `models.py` ModelDispatch: `?model=` picks the model whose coordinator answers an
    # `/admin/*` route or `/metrics`; absent or empty: the first model
    model_query = {
        "name": "model",
        "in": "query",
        "required": False,
        "schema": {"type": "string", "enum": ["", *served_models]},
        "description": f"The model whose coordinator answers; absent or empty: `{served_model}`"
        " (any other name: 404 model_not_found).",
    }
    pool = _path_param("pool", "prefill | decode | colocated.")
    replica = _path_param("replica_id", "A replica id (GET /admin/pools).")
    explain_body = _json_body(
        {
            "anyOf": [
                {"$ref": "#/components/schemas/CompletionRequest"},
                {"$ref": "#/components/schemas/ChatCompletionRequest"},
            ]
        }
    )
    models = {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": {"type": "object", "required": ["id", "object"]}},
        },
    }
    paths: dict[str, Any] = {
        "/v1/completions": {
            "post": openai_op("OpenAI completions (P/D flow)", "CompletionRequest")
        },
        "/v1/chat/completions": {
            "post": openai_op("OpenAI chat completions (P/D flow)", "ChatCompletionRequest")
        },
        "/v1/models": {
            "get": {
                "summary": "The served model",
                "responses": _responses(_ok(models), client_auth),
                **({"security": [{"ApiKey": []}]} if api_keys else {}),
            }
        },
        "/health": {
            "get": {
                "summary": "200 when a decode or colocated replica is routable and the KV-event "
                "join replay after start has ended, else 503 (no_replica, replaying)",
                "responses": _responses(_ok(None), ()),
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (one model's coordinator: `?model=`)",
                "parameters": [model_query],
                "responses": _responses(_ok({"type": "string"}, "text/plain"), (400, 404)),
            }
        },
        **{
            path: {"post": passthrough_op(summary)}
            for path, summary in (
                ("/tokenize", "Forwarded to an engine: the prompt's token ids"),
                ("/detokenize", "Forwarded to an engine: the text of token ids"),
                ("/v1/responses", "Forwarded whole to an engine that serves the Responses API"),
                ("/v1/embeddings", "Forwarded to an engine that serves a pooling model"),
            )
        },
        "/openapi.json": {
            "get": {"summary": "This description", "responses": _responses(_ok(obj), ())}
        },
        "/dashboard": {
            "get": {
                "summary": "The status page (HTML; it polls /admin/dashboard.json)",
                "responses": _responses(_ok({"type": "string"}, "text/html"), ()),
            }
        },
        "/admin/dashboard.json": {
            "get": admin_op("The status page's data: pools, autoscale, recent routes")
        },
        "/admin/pools": {"get": admin_op("Every pool's replicas and state")},
        "/admin/explain": {
            "post": admin_op(
                "The routing decision for a request body (nothing is sent to an engine)",
                (400, 404, 413),
                explain_body,
            )
        },
        "/admin/pools/{pool}/replicas": {
            "post": admin_op(
                "Add a running engine to a pool",
                (400, 403, 404, 409, 413),
                _json_body({"$ref": "#/components/schemas/StaticEndpointSpec"}),
                [pool],
                201,
            )
        },
        "/admin/pools/{pool}/replicas/{replica_id}": {
            "delete": admin_op("Stop routing to a replica", (404, 409), None, [pool, replica])
        },
        "/admin/replicas/{replica_id}/drain": {
            "post": admin_op(
                "Drain a replica (or cancel a drain)",
                (400, 404, 409, 413),
                _json_body({"$ref": "#/components/schemas/DrainBody"}, required=False),
                [replica],
            )
        },
        "/admin/autoscale": {"get": admin_op("Pools, load and the autoscaler's decisions")},
        "/admin/pools/{pool}/scale": {
            "post": admin_op(
                "Set or change a pool's replica count",
                (400, 404, 409, 413),
                _json_body({"$ref": "#/components/schemas/ScaleBody"}, required=False),
                [pool],
            )
        },
        "/admin/pools/{pool}/auto": {
            "post": admin_op(
                "Unpin a pool (the autoscaler drives it)", (400, 404, 409), None, [pool]
            )
        },
        "/admin/replicas/{replica_id}/move": {
            "post": admin_op(
                "Move a replica to another pool (role switch)",
                (400, 404, 409, 413),
                _json_body({"$ref": "#/components/schemas/MoveBody"}, required=False),
                [replica],
            )
        },
    }
    schemas = {
        "Error": _error_schema(),
        **_request_schemas(served_models),
        **_model_schemas([StaticEndpointSpec, DrainBody, ScaleBody, MoveBody]),
    }
    security = {
        "ApiKey": {"type": "http", "scheme": "bearer", "description": "coordinator.api_keys"},
        "AdminToken": {"type": "http", "scheme": "bearer", "description": "admin_token"},
    }
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "pdorch coordinator",
            "version": "1",
            "description": "OpenAI-compatible P/D disaggregation endpoint (pdorch/app/README.md).",
        },
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": security},
    }
