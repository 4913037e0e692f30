"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right status.

Every error the coordinator answers goes through here, so a client library sees the shape it
knows (the OpenAI SDK reads `error.message`) and the status says what went wrong:

| status | when | `type` |
|---|---|---|
| 400 | bad JSON, bad or missing parameters (pdorch maps request validation to 400 as OpenAI
  and vLLM do; it never answers FastAPI's 422) | `invalid_request_error` |
| 401 | no or unknown API key / admin token missing | `authentication_error` |
| 403 | admin token wrong | `permission_error` |
| 404 | unknown model, route or replica | `not_found_error` |
| 405 | wrong method on a known route | `invalid_request_error` |
| 408 | headers / body not in within `header_timeout_s` / `body_timeout_s` | `timeout_error` |
| 409 | admin: replica id already taken | `conflict_error` |
| 413 | body over the configured limit | `invalid_request_error` |
| 429 | over the configured concurrency limit | `rate_limit_error` |
| 431 | headers over `coordinator.max_header_bytes` | `invalid_request_error` |
| 502 | every engine attempt failed | `upstream_error` |
| 503 | no healthy replica; over `max_connections` (`edge.py`) | `service_unavailable_error` |
| 504 | the whole-request deadline passed | `timeout_error` |

Mid-stream failures cannot change the status any more: `error_event` is the SSE form (one
`data: {"error": ...}` event followed by `data: [DONE]`), so a client never hangs.
"""

from __future__ import annotations

from http import HTTPStatus

import msgspec
from starlette.responses import Response

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    502: "upstream_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}
_encode = msgspec.json.Encoder().encode


class ApiError(Exception):
    """An error answer; raise it anywhere on the request path, the app turns it into JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "")
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, dict[str, str | int | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code if self.code is not None else self.status,
            }
        }

    def response(self, extra_headers: dict[str, str] | None = None) -> Response:
        headers = dict(self.headers)
        if extra_headers:
            headers.update(extra_headers)
        return Response(
            _encode(self.body()),
            status_code=self.status,
            media_type="application/json",
            headers=headers,
        )


def error_event(message: str, *, type: str = "upstream_error", code: int = 502) -> bytes:
    """The end of a stream that failed after its first byte: an error event, then [DONE]."""
    body = {"error": {"message": message, "type": type, "param": None, "code": code}}
    return b"data: " + _encode(body) + b"\n\ndata: [DONE]\n\n"
