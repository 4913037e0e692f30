"""The simulated engine's HTTP server: vLLM's OpenAI-compatible API, byte for byte where it counts.

Routes (as vLLM 0.32's `api_server`): `POST /v1/completions`, `POST /v1/chat/completions`
(plain and SSE streaming with `stream_options.include_usage`), `GET /v1/models`, `GET /health`,
`POST /tokenize`, `POST /detokenize`, `GET /metrics`, `POST /reset_prefix_cache` (vLLM dev
mode); plus `GET /sim/info` (role, engine id, profiles, KV side channel) for pools.

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
returns the ids as vLLM does (SERVER.md), so `temperature`, `top_p`, `stop`, ... are
accepted (and validated where vLLM validates them) but do not change the output; output ends by
length (`finish_reason` "length"). `n` choices, `echo` and `logprobs` in vLLM's shapes with
simulated values (`api_generate.py`, `api_logprobs.py`); one prompt per request.

The handlers keep per-token work to a dict build and one `msgspec.json.encode`.
"""

from __future__ import annotations

import time
import uuid
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from pools.sim.api_errors import (
    ApiError,
    chat_messages,
    check_token_ids,
    error_body,
    json_response,
    parse_body,
    prompt_tokens,
)
from pools.sim.api_generate import Generation, streamed_answer, whole_answer
from pools.sim.api_schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)

if TYPE_CHECKING:
    from pools.sim.runner import SimEngine

_SAMPLING_EPS = 1e-5  # vLLM's: a temperature below it is greedy


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

    @app.post("/detokenize")
    async def detokenize(raw: Request) -> Response:
        req: DetokenizeRequest = await parse_body(raw, DetokenizeRequest)
        check_model(req.model)
        check_token_ids(req.tokens or [0], max_token_id)
        return json_response({"prompt": tokenizer.decode(req.tokens)})

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
        echo = None
        if req.echo:
            echo = req.prompt if isinstance(req.prompt, str) else tokenizer.decode(tokens)
            if isinstance(req.prompt, list) and req.prompt and isinstance(req.prompt[0], str):
                echo = str(req.prompt[0])
        return await _run(raw, req, rid, model, tokens, max_tokens, chat=False, echo_text=echo)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(raw: Request) -> Response:
        req: ChatCompletionRequest = await parse_body(raw, ChatCompletionRequest)
        model = check_model(req.model)
        if not req.messages:
            raise ApiError("messages must not be empty", HTTPStatus.BAD_REQUEST, param="messages")
        if req.top_logprobs is not None and not req.logprobs:
            raise ApiError(
                "when using `top_logprobs`, `logprobs` must be set to true.",
                HTTPStatus.BAD_REQUEST,
                param="top_logprobs",
            )
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
        if req.n > 1 and req.temperature is not None and req.temperature < _SAMPLING_EPS:
            raise ApiError(  # vLLM's SamplingParams check
                f"n must be 1 when using greedy sampling, got {req.n}.", HTTPStatus.BAD_REQUEST
            )
        opts = req.stream_options
        include_usage = bool(opts and opts.include_usage)
        if isinstance(req, ChatCompletionRequest):
            top = req.top_logprobs if req.logprobs else None
            logprobs = (top or 0) if req.logprobs else None
        else:
            logprobs = req.logprobs
        g = Generation(
            engine,
            tokenizer,
            rid,
            model,
            tokens,
            max_tokens,
            chat,
            n=req.n,
            seed=req.seed,
            kv_params=req.kv_transfer_params,
            lora=loras.get(model),
            return_ids=bool(req.return_token_ids),
            echo_text=echo_text,
            logprobs=logprobs,
            include_usage=include_usage,
            continuous=include_usage and bool(opts and opts.continuous_usage_stats),
        )
        g.submit(0)
        if not req.stream:
            return await whole_answer(raw, g)
        return streamed_answer(g)

    app.state.engine = engine
    return app
