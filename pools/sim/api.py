"""The simulated engine's HTTP server: vLLM's OpenAI-compatible API, byte for byte where it counts.

Routes (as vLLM 0.32's `api_server`): `POST /v1/completions`, `POST /v1/chat/completions`
(plain and SSE streaming with `stream_options.include_usage`), `GET /v1/models`, `GET /health`,
`POST /tokenize`, `GET /metrics`, `POST /reset_prefix_cache` (vLLM dev mode); plus
`GET /sim/info` (role, engine id, profiles, KV side channel) for pools.

Wire rules copied from vLLM's behaviour (read from its source, re-implemented):
- errors are `{"error": {"message", "type", "param", "code"}}` with the HTTP status in `code`:
  unknown model 404 `NotFoundError` (param `model`); a prompt longer than `max_model_len` 400
  `BadRequestError` (param `input_tokens`); a prompt token id outside the vocabulary 400
  `BadRequestError` "Token id N is out of vocabulary" (param null); invalid fields 400
  `Bad Request` (FastAPI validation, param = dotted field path); JSON nested too deep 400; a
  failed KV load on a decode leg 500 `InternalServerError`.
- SSE: every chunk is `data: <json>\\n\\n`; the stream ends with `data: [DONE]\\n\\n`; with
  `include_usage` a last chunk has `choices: []` and the usage; errors after the stream started
  are sent as a `data: {"error": ...}` chunk.
- P/D: a request whose `kv_transfer_params.do_remote_decode` is true is prefilled and its
  response carries top-level `kv_transfer_params` for the decode engine (NixlConnector shape).
- A client that disconnects aborts its request, streamed or not (vLLM's `with_cancellation`).

Simulated, not modelled: sampling. The next generated token is a pure function of (`seed`,
prompt + the outputs so far) (`pools.sim.token_gen`, like greedy decoding); `return_token_ids`
returns the ids as vLLM does (SERVER.md), so `temperature`, `top_p`, `stop`, `logprobs`, ... are
accepted (and validated where vLLM validates them) but do not change the output; output ends by
length (`finish_reason` "length"). One choice per request (`n` = 1), one prompt per request.

The handlers keep per-token work to a dict build and one `msgspec.json.encode`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response, StreamingResponse

from pools.sim.api_errors import (
    JSON,
    ApiError,
    chat_messages,
    check_token_ids,
    error_body,
    json_response,
    parse_body,
    prompt_tokens,
    usage_info,
)
from pools.sim.api_schemas import ChatCompletionRequest, CompletionRequest, TokenizeRequest
from pools.sim.streams import EngineUnavailable

if TYPE_CHECKING:
    from pools.sim.outputs import RequestOutput
    from pools.sim.runner import SimEngine
    from pools.sim.streams import RequestStream


def _wire_params(final: RequestOutput | None) -> dict[str, Any] | None:
    """A final output's `kv_transfer_params` as the response's JSON object (None: none)."""
    params = final.kv_transfer_params if final is not None else None
    return params.wire() if params is not None else None


def create_app(engine: SimEngine) -> FastAPI:
    """The FastAPI app serving `engine` (one simulated engine; many can share a process)."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from starlette.responses import Response

    app = FastAPI(title="pdorch simulated engine", docs_url=None, redoc_url=None)
    served = engine.served_model_names
    max_model_len = engine.max_model_len
    tokenizer = engine.tokenizer
    # vLLM takes the larger of the tokenizer's and the model's vocabulary as the last valid id
    max_token_id = max(tokenizer.vocab_size, engine.timing.model.vocab_size) - 1

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> Response:
        return json_response(exc.body(), int(exc.status))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        body = error_body(str(exc), HTTPStatus.BAD_REQUEST, HTTPStatus.BAD_REQUEST.phrase)
        return json_response(body, 400)

    loras = engine.loras

    def check_model(name: str | None) -> str:
        if name is None or name in served:
            return served[0]
        if name in loras:  # vLLM answers with the adapter's name as `model`
            return name
        raise ApiError(
            f"The model `{name}` does not exist. Valid aliases: {', '.join(served)}.",
            HTTPStatus.NOT_FOUND,
            "NotFoundError",
            "model",
        )

    def check_length(prompt_len: int, max_tokens: int | None, param: str) -> int:
        if prompt_len > max_model_len:
            raise ApiError(
                f"This model's maximum context length is {max_model_len} tokens. However, your "
                f"prompt contains {prompt_len} input tokens, which exceeds this limit even "
                "without any output tokens. Please reduce the length of the input prompt.",
                HTTPStatus.BAD_REQUEST,
                param="input_tokens",
            )
        if max_tokens is not None and max_tokens > max_model_len:
            raise ApiError(
                f"{param}={max_tokens} cannot be greater than max_model_len={max_model_len}. "
                "Please request fewer output tokens.",
                HTTPStatus.BAD_REQUEST,
                param=param,
            )
        limit = max_model_len - prompt_len
        budget = limit if max_tokens is None else min(max_tokens, limit)
        if budget < 1:
            raise ApiError(
                f"This model's maximum context length is {max_model_len} tokens. However, your "
                f"prompt contains {prompt_len} input tokens, leaving no room for output tokens.",
                HTTPStatus.BAD_REQUEST,
                param="input_tokens",
            )
        return budget

    def request_id(raw: Request, prefix: str) -> str:
        header = raw.headers.get("x-request-id")
        return f"{prefix}-{header}" if header else f"{prefix}-{uuid.uuid4().hex}"

    @app.get("/health")
    async def health() -> Response:
        if not engine.healthy:
            return Response(status_code=503)
        return Response(status_code=200)

    def permission(created: int) -> dict[str, Any]:
        return {
            "id": f"modelperm-{uuid.uuid4().hex}",
            "object": "model_permission",
            "created": created,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }

    @app.get("/v1/models")
    async def models() -> Response:
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": engine.model_root,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [permission(created)],
            }
            for name in served
        ]
        # loaded adapters as vLLM lists them: id = adapter name, root = its path, parent = base
        data += [
            {
                "id": lora.name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": lora.path,
                "parent": served[0],
                "max_model_len": None,
                "permission": [permission(created)],
            }
            for lora in loras.values()
        ]
        return json_response({"object": "list", "data": data})

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        # vLLM (dev mode) answers 200 either way; AllBlocksCleared goes out with the next step
        engine.reset_prefix_cache()
        return Response(status_code=200)

    @app.get("/sim/info")
    async def sim_info() -> Response:
        return json_response(engine.info())

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(
            engine.render_metrics(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    @app.post("/tokenize")
    async def tokenize(raw: Request) -> Response:
        req: TokenizeRequest = await parse_body(raw, TokenizeRequest)
        check_model(req.model)
        if req.messages is not None:
            tokens = tokenizer.encode_chat(chat_messages(req.messages), req.add_generation_prompt)
        elif req.prompt is not None:
            add = True if req.add_special_tokens is None else req.add_special_tokens
            tokens = tokenizer.encode_prompt(req.prompt, add_special_tokens=add)
        else:
            raise ApiError("Either `prompt` or `messages` is required.", HTTPStatus.BAD_REQUEST)
        body: dict[str, Any] = {
            "count": len(tokens),
            "max_model_len": max_model_len,
            "tokens": tokens,
            "token_strs": [tokenizer.token_text(t) for t in tokens]
            if req.return_token_strs
            else None,
        }
        return json_response(body)

    @app.post("/v1/completions", response_model=None)
    async def completions(raw: Request) -> Response:
        req: CompletionRequest = await parse_body(raw, CompletionRequest)
        model = check_model(req.model)
        tokens = prompt_tokens(req.prompt, tokenizer)
        if not tokens:
            raise ApiError("Prompt cannot be empty", HTTPStatus.BAD_REQUEST, param="prompt")
        check_token_ids(tokens, max_token_id)
        max_tokens = check_length(len(tokens), req.max_tokens, "max_tokens")
        rid = request_id(raw, "cmpl")
        return await _run(raw, req, rid, model, tokens, max_tokens, chat=False, echo_text=None)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(raw: Request) -> Response:
        req: ChatCompletionRequest = await parse_body(raw, ChatCompletionRequest)
        model = check_model(req.model)
        if not req.messages:
            raise ApiError("messages must not be empty", HTTPStatus.BAD_REQUEST, param="messages")
        tokens = tokenizer.encode_chat(chat_messages(req.messages), req.add_generation_prompt)
        limit = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = check_length(len(tokens), limit, param)
        rid = request_id(raw, "chatcmpl")
        return await _run(raw, req, rid, model, tokens, max_tokens, chat=True, echo_text=None)

    async def _run(
        raw: Request,
        req: CompletionRequest | ChatCompletionRequest,
        rid: str,
        model: str,
        tokens: list[int],
        max_tokens: int,
        *,
        chat: bool,
        echo_text: str | None,
    ) -> Response:
        kv_params = req.kv_transfer_params
        try:
            stream = engine.submit(
                request_id=rid,
                prompt_token_ids=tokens,
                max_tokens=max_tokens,
                seed=req.seed,
                kv_transfer_params=kv_params,
                lora=loras.get(model),
            )
        except ValueError as exc:  # the core names the field it refused
            raise ApiError(str(exc), HTTPStatus.BAD_REQUEST) from exc
        except EngineUnavailable as exc:
            raise ApiError(str(exc), HTTPStatus.SERVICE_UNAVAILABLE) from exc
        created = int(time.time())
        return_ids = bool(req.return_token_ids)
        if not req.stream:
            text_parts: list[str] = []
            out_ids: list[int] = []
            n_out = 0
            # vLLM (`with_cancellation`) aborts a non-streamed request whose client hangs up;
            # a streamed one is aborted by StreamingResponse's own disconnect listener.
            watcher = asyncio.get_running_loop().create_task(_abort_on_disconnect(raw, stream))
            try:
                async for out in stream:
                    if out.error is not None:
                        raise ApiError(out.error, HTTPStatus.INTERNAL_SERVER_ERROR)
                    for t in out.token_ids:
                        text_parts.append(tokenizer.token_text(t))
                    n_out += len(out.token_ids)
                    if return_ids:
                        out_ids.extend(out.token_ids)
            finally:
                watcher.cancel()
                stream.close()
            if watcher.done() and not watcher.cancelled():
                return Response(status_code=499)  # nobody reads it: the client is gone
            final = stream.final
            text = "".join(text_parts)
            usage = usage_info(len(tokens), n_out)
            finish = final.finish_reason if final else "abort"
            body: dict[str, Any]
            if chat:
                body = {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {
                                "role": "assistant",
                                "content": text,
                                "refusal": None,
                                "annotations": None,
                                "audio": None,
                                "function_call": None,
                                "tool_calls": [],
                                "reasoning": None,
                            },
                            "logprobs": None,
                            "finish_reason": finish,
                            "stop_reason": None,
                            "token_ids": out_ids if return_ids else None,
                        }
                    ],
                    "service_tier": None,
                    "system_fingerprint": None,
                    "usage": usage,
                    "prompt_logprobs": None,
                    "prompt_token_ids": tokens if return_ids else None,
                    "kv_transfer_params": _wire_params(final),
                }
            else:
                body = {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "text": text,
                            "logprobs": None,
                            "finish_reason": finish,
                            "stop_reason": None,
                            "prompt_logprobs": None,
                        }
                    ],
                    "service_tier": None,
                    "system_fingerprint": None,
                    "usage": usage,
                    "kv_transfer_params": _wire_params(final),
                }
            if return_ids and not chat:  # vLLM's `CompletionResponseChoice` fields
                body["choices"][0].update(prompt_token_ids=tokens, token_ids=out_ids)
            return json_response(body)

        opts = req.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = include_usage and bool(opts and opts.continuous_usage_stats)
        return StreamingResponse(
            _sse(stream, rid, model, created, tokens, chat, include_usage, continuous, return_ids),
            media_type="text/event-stream",
        )

    async def _sse(
        stream: Any,
        rid: str,
        model: str,
        created: int,
        prompt: list[int],
        chat: bool,
        include_usage: bool,
        continuous: bool,
        return_ids: bool,
    ) -> AsyncIterator[bytes]:
        """`return_ids` (vLLM's `return_token_ids`): chat's first chunk carries the prompt's
        ids (`prompt_token_ids`, top level), completions' first token chunk (in the choice);
        every token chunk's choice its `token_ids`."""
        obj = "chat.completion.chunk" if chat else "text_completion"
        prompt_len = len(prompt)
        n_out = 0
        prompt_ids_due = return_ids and not chat

        def chunk(choice: dict[str, Any], prompt_ids: list[int] | None = None) -> bytes:
            body: dict[str, Any] = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [choice],
            }
            if prompt_ids is not None:
                body["prompt_token_ids"] = prompt_ids
            if continuous:
                body["usage"] = usage_info(prompt_len, n_out, streaming=True)
            return b"data: " + JSON.encode(body) + b"\n\n"

        try:
            if chat:
                yield chunk(
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    },
                    prompt if return_ids else None,
                )
            async for out in stream:
                if out.error is not None:
                    err = error_body(
                        out.error, HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError"
                    )
                    yield b"data: " + JSON.encode(err) + b"\n\n"
                    break
                n_out += len(out.token_ids)
                text = "".join(tokenizer.token_text(t) for t in out.token_ids)
                finish = out.finish_reason
                if not out.token_ids and finish is None:
                    continue
                choice: dict[str, Any]
                if chat:
                    delta: dict[str, Any] = {"content": text} if out.token_ids else {}
                    choice = {
                        "index": 0,
                        "delta": delta,
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": None,
                    }
                else:
                    choice = {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": None,
                    }
                if return_ids:
                    if prompt_ids_due:
                        choice["prompt_token_ids"] = prompt
                        prompt_ids_due = False
                    choice["token_ids"] = out.token_ids
                yield chunk(choice)
            else:
                if include_usage:
                    usage = usage_info(prompt_len, n_out, streaming=True)
                    body = {
                        "id": rid,
                        "object": obj,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage,
                    }
                    yield b"data: " + JSON.encode(body) + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            stream.close()

    app.state.engine = engine
    return app


async def _abort_on_disconnect(raw: Request, stream: RequestStream) -> None:
    """Wait for the client's `http.disconnect`, then abort the request (`stream.cancel()`).

    The body has been read already, so every further ASGI message is either the disconnect or
    (uvicorn, once the response is complete) the same; the caller cancels this task when the
    request finishes first."""
    while (await raw.receive())["type"] != "http.disconnect":
        pass
    stream.cancel()
