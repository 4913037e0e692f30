"""The sim server's wire helpers: OpenAI-shaped errors, body parsing, prompts, usage.

Shapes as vLLM 0.32's API server (read from its source, re-implemented; `api.py` lists the
rules): errors are `{"error": {"message", "type", "param", "code"}}` with the HTTP status in
`code`; a validation error reads "N validation error(s):" plus one line per error.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import msgspec
from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from pools.sim.api_schemas import ChatMessage

if TYPE_CHECKING:
    from pools.sim.tokenization import SimTokenizer

JSON = msgspec.json.Encoder()
"""One encoder for every response body and SSE chunk."""


class ApiError(Exception):
    """An OpenAI-shaped error with its HTTP status."""

    def __init__(
        self,
        message: str,
        status: HTTPStatus,
        err_type: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type or _default_type(status)
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status, self.err_type, self.param)


def _default_type(status: HTTPStatus) -> str:
    return {
        HTTPStatus.BAD_REQUEST: "BadRequestError",
        HTTPStatus.NOT_FOUND: "NotFoundError",
        HTTPStatus.INTERNAL_SERVER_ERROR: "InternalServerError",
        HTTPStatus.SERVICE_UNAVAILABLE: "ServiceUnavailableError",
    }.get(status, status.phrase)


def error_body(
    message: str, status: HTTPStatus, err_type: str, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": int(status)}}


def validation_error(exc: ValidationError) -> ApiError:
    """vLLM's validation handler: "N validation error(s):" + one line per error, param = loc."""
    errors = exc.errors(include_url=False)
    label = "error" if len(errors) == 1 else "errors"
    lines = [f"{len(errors)} validation {label}:"]
    for err in errors[:10]:
        shown = {k: err[k] for k in ("type", "loc", "msg", "input") if k in err}
        shown["loc"] = "body." + ".".join(str(p) for p in err["loc"])
        if isinstance(shown.get("input"), (list, dict, tuple)):
            shown["input"] = f"<{type(shown['input']).__name__} of {len(shown['input'])} items>"
        lines.append(f"  {shown}")
    param = "body." + ".".join(str(p) for p in errors[0]["loc"]) if errors else None
    return ApiError("\n".join(lines), HTTPStatus.BAD_REQUEST, HTTPStatus.BAD_REQUEST.phrase, param)


def json_response(body: Any, status: int = 200) -> Response:
    return Response(JSON.encode(body), status_code=status, media_type="application/json")


async def parse_body(request: Request, model: type[BaseModel]) -> Any:
    raw = await request.body()
    try:
        data = msgspec.json.decode(raw) if raw else {}
    except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ApiError(
            f"JSON decode error: {exc}", HTTPStatus.BAD_REQUEST, HTTPStatus.BAD_REQUEST.phrase
        ) from None
    if not isinstance(data, dict):
        raise ApiError(
            "Input should be a valid dictionary", HTTPStatus.BAD_REQUEST, "Bad Request", "body"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from exc


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Chat messages as plain dicts with string content (text parts joined, as vLLM does)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        content = m.content
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
        out.append({"role": m.role, "content": content or ""})
    return out


def prompt_tokens(
    prompt: str | list[int] | list[str] | list[list[int]], tokenizer: SimTokenizer
) -> list[int]:
    """One prompt (text or token ids) as token ids; a batch of one is unwrapped."""
    if isinstance(prompt, str):
        return tokenizer.encode_prompt(prompt, add_special_tokens=True)
    first = prompt[0] if prompt else None
    if isinstance(first, (str, list)):  # a batch, of texts or of id lists
        if len(prompt) != 1:
            raise ApiError(
                "The simulated engine serves one prompt per request.",
                HTTPStatus.BAD_REQUEST,
                param="prompt",
            )
        return prompt_tokens(first, tokenizer)
    # token ids: the schema validated the list as one of its list types, so all are ints here
    return [int(t) for t in prompt if isinstance(t, int)]


def check_token_ids(tokens: list[int], max_token_id: int) -> None:
    """vLLM's out-of-vocabulary check (`BaseRenderer.validate_token_ids`): a prompt id below 0
    or above `max_token_id` (the larger of the tokenizer's and the model's last id) is the
    client's fault, 400 `BadRequestError` "Token id N is out of vocabulary", param null."""
    low, high = min(tokens), max(tokens)
    bad = low if low < 0 else high if high > max_token_id else None
    if bad is not None:
        raise ApiError(f"Token id {bad} is out of vocabulary", HTTPStatus.BAD_REQUEST)


def usage_info(prompt: int, completion: int, streaming: bool = False) -> dict[str, Any]:
    """vLLM's UsageInfo; streamed chunks drop null fields (vLLM dumps them with exclude_none).
    `prompt_tokens_details` stays null: vLLM fills it only with --enable-prompt-tokens-details."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if not streaming:
        usage["prompt_tokens_details"] = None
    return usage
