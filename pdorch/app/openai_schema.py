"""Request validation for `/v1/completions` and `/v1/chat/completions`, without pydantic.

The body is decoded once with msgspec into plain Python objects and only the fields the
coordinator *reads* are checked (model, prompt/messages, stream, max tokens, n); everything
else travels to the engines untouched and the engine validates it (its 400 is passed through).
A pydantic model of the whole OpenAI schema would re-validate every message on the hot path
for no routing benefit; at ~1.5k req/s that is a measurable share of a core.

Rules (all failures are `ApiError`s, 400 unless noted; pdorch never answers 422):
- body: a JSON object (not JSON, invalid UTF-8, or nested deeper than msgspec's recursion
  guard allows, ~1000 levels → 400 `invalid_json`, never the 500/502 a `RecursionError` would
  give);
- `model`: a string; not the served model or a loaded LoRA adapter → 404 `model_not_found`
  naming the served ones;
- completions: `prompt` a non-empty string, a list of token ids, or a batch (a list) of
  those, at most `MAX_BATCH` prompts; a batch of one is that prompt, a larger one is served by
  `fanout.py` (one P/D flow per prompt, `ParsedRequest.batch`);
- chat: `messages` a non-empty list of objects with a string `role`;
- `stream` a boolean; `stream_options` an object; `max_tokens`/`max_completion_tokens`
  integers ≥ 1; `n` an integer in 1..`MAX_CHOICES` (one prefill, `n` choices on the decode
  engine), and at most `MAX_CHOICES` choices in all (prompts x `n`), since each is a sequence
  the decode engine holds;
- `prompt_embeds` (vLLM's) → 400 naming it: pdorch routes by the prompt's tokens and cannot
  tokenize embeddings;
- `kv_transfer_params` from a client is dropped: only the coordinator sets it. So is a body
  `request_id` (vLLM's chat request reads one when no `X-Request-Id` header comes): request
  ids upstream are the coordinator's alone, so one client cannot collide with another's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from pdorch.app.errors import ApiError

RequestKind = Literal["completion", "chat"]
_decode = msgspec.json.Decoder().decode
MAX_BATCH = 64  # prompts per /v1/completions request (each a P/D flow of its own)
MAX_CHOICES = 64  # choices per request: prompts x n
# fields pdorch cannot serve, with why (the error names the field)
UNSUPPORTED = {
    "prompt_embeds": "pdorch routes by the prompt's tokens; send the prompt as text or token ids",
}


@dataclass(slots=True)
class ParsedRequest:
    """A validated client request: its body (to forward) and the fields routing reads."""

    kind: RequestKind
    body: dict[str, Any]
    stream: bool
    prompt: str | list[int] | None
    messages: list[dict[str, Any]] | None
    max_tokens: int | None
    prompt_text: str
    chat_template_kwargs: dict[str, Any] | None = None
    n: int = 1
    # completions with several prompts: each one (the flow's `prompt` is the first)
    batch: list[str | list[int]] | None = None
    # the client's bytes when `body` is exactly their JSON (validation removed or rewrote
    # nothing): the decode legs splice fields into them instead of re-encoding (`leg_bytes.py`)
    raw: bytes | None = None

    def for_prompt(self, prompt: str | list[int]) -> ParsedRequest:
        """This request with one prompt of its batch (`fanout.py` runs one flow each)."""
        body = {**self.body, "prompt": prompt}
        text = prompt if isinstance(prompt, str) else ""
        return ParsedRequest(
            self.kind, body, self.stream, prompt, None, self.max_tokens, text, None, self.n
        )


def _bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(f"'{name}' must be an integer >= 1, got {value!r}.", param=name)
    return value


def _token_ids(value: list[Any]) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def _prompts(body: dict[str, Any]) -> list[str | list[int]]:
    """The request's prompts: one, or each of a batch (module docstring)."""
    if "prompt" not in body:
        raise _bad("'prompt' is required.", param="prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) > MAX_BATCH:
            raise _bad(
                f"A batch holds at most {MAX_BATCH} prompts, got {len(prompt)}.", param="prompt"
            )
        kind = type(prompt[0])
        if not all(isinstance(p, kind) for p in prompt):  # vLLM: list[str] | list[list[int]]
            raise _bad("A batch is either all strings or all lists of token ids.", param="prompt")
        return [_one_prompt(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
    return [_one_prompt(prompt, "prompt")]


def _one_prompt(prompt: Any, param: str) -> str | list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise _bad(f"'{param}' must not be empty.", param=param)
        return prompt
    if isinstance(prompt, list) and prompt and _token_ids(prompt):
        return prompt
    raise _bad(
        f"'{param}' must be a non-empty string or a non-empty list of token ids.", param=param
    )


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list.", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _bad(
                f"messages[{i}] must be an object with a string 'role'.",
                param=f"messages[{i}]",
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise _bad(
                f"messages[{i}].content must be a string or a list of parts.",
                param=f"messages[{i}].content",
            )
    return messages


def parse_request(
    raw: bytes, kind: RequestKind, served_model: str, adapters: Sequence[str] = ()
) -> ParsedRequest:
    """Decode and check one request body (see the module docstring for the rules);
    `adapters`: the LoRA adapters a client may name as `model` besides `served_model`."""
    try:
        body = _decode(raw)
    except msgspec.DecodeError as exc:  # malformed, or invalid UTF-8
        raise _bad(f"The body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:  # msgspec's depth guard (the interpreter's recursion limit)
        raise _bad("The body's JSON is nested too deeply.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise _bad("The body must be a JSON object.", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str):
        raise _bad("'model' is required and must be a string.", param="model")
    if model != served_model and model not in adapters:
        served = ", ".join(f"`{name}`" for name in (served_model, *adapters))
        raise ApiError(
            404,
            f"The model `{model}` does not exist (this endpoint serves {served}).",
            param="model",
            code="model_not_found",
        )
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean.", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("'stream_options' must be an object.", param="stream_options")
    n = body.get("n")
    if n is None:
        n = 1
    elif isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise _bad(f"'n' must be an integer in 1..{MAX_CHOICES}, got {n!r}.", param="n")
    for name, why in UNSUPPORTED.items():
        if body.get(name) is not None:
            raise _bad(f"'{name}' is not supported by pdorch: {why}.", param=name)
    pristine = "kv_transfer_params" not in body and "request_id" not in body
    body.pop("kv_transfer_params", None)  # only the coordinator speaks the KV protocol
    body.pop("request_id", None)  # ids upstream are the coordinator's (module docstring)
    max_tokens = _positive_int(body, "max_tokens")
    if kind == "chat":
        max_completion = _positive_int(body, "max_completion_tokens")
        if max_completion is not None:
            max_tokens = max_completion
        messages = _messages(body)
        kwargs = body.get("chat_template_kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise _bad("'chat_template_kwargs' must be an object.", param="chat_template_kwargs")
        text = "\n".join(_content_text(m.get("content")) for m in messages)
        kept = raw if pristine else None
        return ParsedRequest(
            kind, body, stream, None, messages, max_tokens, text, kwargs, n, raw=kept
        )
    prompts = _prompts(body)
    if len(prompts) * n > MAX_CHOICES:
        raise _bad(
            f"{len(prompts)} prompts x n={n} is over {MAX_CHOICES} choices per request.",
            param="n",
        )
    prompt = prompts[0]
    if len(prompts) == 1:
        if body.get("prompt") is not prompt:
            pristine = False
        body["prompt"] = prompt  # a batch of one is that prompt
    text = prompt if isinstance(prompt, str) else ""
    batch = prompts if len(prompts) > 1 else None
    kept = raw if pristine and batch is None else None
    return ParsedRequest(kind, body, stream, prompt, None, max_tokens, text, None, n, batch, kept)
