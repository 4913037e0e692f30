"""One generation request of the simulated OpenAI server: `n` choices, echo, logprobs, SSE.

Shapes as vLLM 0.32's `serving_completion` / `serving_chat` (read from its source,
re-implemented):
- `n > 1`: the request becomes `n` engine requests (vLLM's parallel sampling: child `i` has id
  `{i}_{request id}` and seed `seed + i` when a seed is given). Only child 0 carries the
  decode leg's `kv_transfer_params` (one KV pull), and children 1.. are queued when child 0's
  first token is out, so they find its prompt blocks in the prefix cache: one prefill, `n`
  choices. Choices carry `index` 0..n-1; streamed, their chunks interleave as the engine
  produces them; usage counts the prompt once and every choice's tokens.
- `echo` (completions): the prompt's text before the output (streamed: in each choice's first
  chunk); with `logprobs`, the prompt tokens' logprobs first (the very first `null`).
- `logprobs` (completions: `logprobs: k`; chat: `logprobs: true` + `top_logprobs: k`): values
  from `api_logprobs.py`, per chunk when streamed.
- SSE: `data: <json>\\n\\n` chunks, chat's opening role chunk per choice, `[DONE]` at the end;
  `stream_options.include_usage` a last chunk with `choices: []` and the usage,
  `continuous_usage_stats` usage on every chunk (that choice's tokens so far); an engine error
  after the start is a `data: {"error": ...}` chunk.
- A client that disconnects aborts every child (streamed: the stream's `finally`; not
  streamed: a disconnect watcher, vLLM's `with_cancellation`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from starlette.responses import Response, StreamingResponse

from pools.sim.api_errors import JSON, ApiError, error_body, json_response, usage_info
from pools.sim.api_logprobs import chat_logprobs, completion_logprobs
from pools.sim.streams import EngineUnavailable, StreamDelta

if TYPE_CHECKING:
    from fastapi import Request

    from pools.sim.lora import LoraAdapter
    from pools.sim.runner import SimEngine
    from pools.sim.streams import RequestStream
    from pools.sim.tokenization import SimTokenizer
    from transfer.params import KvTransferParams


@dataclass(slots=True)
class Generation:
    """What one request asks of the engine (the handlers fill it from the validated body)."""

    engine: SimEngine
    tokenizer: SimTokenizer
    rid: str
    model: str
    prompt: list[int]
    max_tokens: int
    chat: bool
    n: int = 1
    seed: int | None = None
    kv_params: KvTransferParams | None = None
    lora: LoraAdapter | None = None  # the adapter the request names (every choice runs with it)
    return_ids: bool = False
    echo_text: str | None = None  # completions' `echo`: the prompt's text
    logprobs: int | None = None  # top-k (completions' `logprobs`, chat's `top_logprobs`)
    include_usage: bool = False
    continuous: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    streams: list[RequestStream] = field(default_factory=list)

    def submit(self, index: int) -> RequestStream:
        """Queue child `index` (module docstring); ApiError when the engine refuses."""
        rid = self.rid if self.n == 1 else f"{index}_{self.rid}"
        seed = self.seed if self.seed is None else self.seed + index
        try:
            stream = self.engine.submit(
                request_id=rid,
                prompt_token_ids=self.prompt,
                max_tokens=self.max_tokens,
                seed=seed,
                kv_transfer_params=self.kv_params if index == 0 else None,
                lora=self.lora,
            )
        except ValueError as exc:  # the core names the field it refused
            raise ApiError(str(exc), HTTPStatus.BAD_REQUEST) from exc
        except EngineUnavailable as exc:
            raise ApiError(str(exc), HTTPStatus.SERVICE_UNAVAILABLE) from exc
        self.streams.append(stream)
        return stream

    def close(self) -> None:
        for stream in self.streams:
            stream.close()

    def cancel(self) -> None:
        for stream in self.streams:
            stream.cancel()

    async def deltas(self) -> AsyncIterator[tuple[int, StreamDelta]]:
        """Every child's deltas as they come, `(choice index, delta)`; child 0 is submitted
        already (`submit(0)` in the handler, so a refusal is an HTTP error)."""
        first = self.streams[0]
        if self.n == 1:
            async for delta in first:
                yield 0, delta
            return
        queue: asyncio.Queue[tuple[int, StreamDelta | None]] = asyncio.Queue()

        async def pump(index: int, stream: RequestStream) -> None:
            try:
                async for delta in stream:
                    await queue.put((index, delta))
            finally:
                await queue.put((index, None))

        tasks: list[asyncio.Task[None]] = []
        live = 0
        try:
            async for delta in first:
                if not tasks and delta.error is None:
                    # child 0's first token: its prompt blocks are cached, queue the others
                    for i in range(1, self.n):
                        tasks.append(asyncio.ensure_future(pump(i, self.submit(i))))
                        live += 1
                yield 0, delta
                while not queue.empty():  # the others' deltas so far, in order
                    index, other = queue.get_nowait()
                    if other is None:
                        live -= 1
                    else:
                        yield index, other
            while live:
                index, other = await queue.get()
                if other is None:
                    live -= 1
                else:
                    yield index, other
        finally:
            for task in tasks:
                task.cancel()


@dataclass(slots=True)
class _Choice:
    """One choice's output so far."""

    parts: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    finish: str | None = None
    text_len: int = 0  # streamed text so far (completions' logprobs `text_offset`)
    started: bool = False


def _logprobs_of(g: Generation, ids: list[int], echo: bool, offset: int) -> dict[str, Any] | None:
    if g.logprobs is None:
        return None
    if g.chat:
        return chat_logprobs(g.tokenizer, ids, g.logprobs)
    if echo:
        return completion_logprobs(
            g.tokenizer, g.prompt + ids, g.logprobs, offset, first_is_prompt_start=True
        )
    return completion_logprobs(g.tokenizer, ids, g.logprobs, offset)


async def whole_answer(raw: Request, g: Generation) -> Response:
    """The non-streamed answer (`n` choices, usage, the prefill's `kv_transfer_params`)."""
    choices = [_Choice() for _ in range(g.n)]
    watcher = asyncio.get_running_loop().create_task(_abort_on_disconnect(raw, g))
    try:
        async for index, delta in g.deltas():
            if delta.error is not None:
                raise ApiError(delta.error, HTTPStatus.INTERNAL_SERVER_ERROR)
            choice = choices[index]
            choice.parts.extend(g.tokenizer.token_text(t) for t in delta.token_ids)
            choice.ids.extend(delta.token_ids)
            if delta.finish_reason is not None:
                choice.finish = delta.finish_reason
    finally:
        watcher.cancel()
        g.close()
    if watcher.done() and not watcher.cancelled():
        return Response(status_code=499)  # nobody reads it: the client is gone
    final = g.streams[0].final
    params = final.kv_transfer_params if final is not None else None
    usage = usage_info(len(g.prompt), sum(len(c.ids) for c in choices))
    body: dict[str, Any] = {
        "id": g.rid,
        "object": "chat.completion" if g.chat else "text_completion",
        "created": g.created,
        "model": g.model,
        "choices": [_whole_choice(g, i, c) for i, c in enumerate(choices)],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage,
    }
    if g.chat:
        body["prompt_logprobs"] = None
        body["prompt_token_ids"] = g.prompt if g.return_ids else None
    body["kv_transfer_params"] = params.wire() if params is not None else None
    return json_response(body)


def _whole_choice(g: Generation, index: int, c: _Choice) -> dict[str, Any]:
    text = "".join(c.parts)
    finish = c.finish or "abort"
    if g.chat:
        return {
            "index": index,
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
            "logprobs": _logprobs_of(g, c.ids, False, 0),
            "finish_reason": finish,
            "stop_reason": None,
            "token_ids": c.ids if g.return_ids else None,
        }
    echo = g.echo_text is not None
    choice: dict[str, Any] = {
        "index": index,
        "text": (g.echo_text or "") + text,
        "logprobs": _logprobs_of(g, c.ids, echo, 0),
        "finish_reason": finish,
        "stop_reason": None,
        "prompt_logprobs": None,
    }
    if g.return_ids:  # vLLM's `CompletionResponseChoice` fields
        choice.update(prompt_token_ids=g.prompt, token_ids=c.ids)
    return choice


def streamed_answer(g: Generation) -> StreamingResponse:
    return StreamingResponse(_sse(g), media_type="text/event-stream")


async def _sse(g: Generation) -> AsyncIterator[bytes]:
    """The SSE chunks (module docstring). `return_ids`: chat's first role chunk carries the
    prompt's ids (`prompt_token_ids`, top level), completions' first token chunk of each
    choice (in the choice); every token chunk's choice its `token_ids`."""
    obj = "chat.completion.chunk" if g.chat else "text_completion"
    prompt_len = len(g.prompt)
    choices = [_Choice() for _ in range(g.n)]

    def chunk(choice: dict[str, Any], done: int, prompt_ids: list[int] | None = None) -> bytes:
        body: dict[str, Any] = {
            "id": g.rid,
            "object": obj,
            "created": g.created,
            "model": g.model,
            "choices": [choice],
        }
        if prompt_ids is not None:
            body["prompt_token_ids"] = prompt_ids
        if g.continuous:
            body["usage"] = usage_info(prompt_len, done, streaming=True)
        return b"data: " + JSON.encode(body) + b"\n\n"

    try:
        if g.chat:
            for i in range(g.n):
                role = {
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                yield chunk(role, 0, g.prompt if g.return_ids and i == 0 else None)
        async for index, out in g.deltas():
            if out.error is not None:
                err = error_body(out.error, HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError")
                yield b"data: " + JSON.encode(err) + b"\n\n"
                break
            c = choices[index]
            c.ids.extend(out.token_ids)
            finish = out.finish_reason
            if not out.token_ids and finish is None:
                continue
            text = "".join(g.tokenizer.token_text(t) for t in out.token_ids)
            choice: dict[str, Any]
            if g.chat:
                choice = {
                    "index": index,
                    "delta": {"content": text} if out.token_ids else {},
                    "logprobs": _logprobs_of(g, out.token_ids, False, 0) if out.token_ids else None,
                    "finish_reason": finish,
                    "stop_reason": None,
                }
            else:
                echo = g.echo_text is not None and not c.started
                if echo:
                    text = (g.echo_text or "") + text
                choice = {
                    "index": index,
                    "text": text,
                    "logprobs": _logprobs_of(g, out.token_ids, echo, c.text_len),
                    "finish_reason": finish,
                    "stop_reason": None,
                }
                c.text_len += len(text)
            if g.return_ids:
                if not g.chat and not c.started:
                    choice["prompt_token_ids"] = g.prompt
                choice["token_ids"] = out.token_ids
            c.started = True
            yield chunk(choice, len(c.ids))
        else:
            if g.include_usage:
                usage = usage_info(prompt_len, sum(len(c.ids) for c in choices), streaming=True)
                body = {
                    "id": g.rid,
                    "object": obj,
                    "created": g.created,
                    "model": g.model,
                    "choices": [],
                    "usage": usage,
                }
                yield b"data: " + JSON.encode(body) + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        g.close()


async def _abort_on_disconnect(raw: Request, g: Generation) -> None:
    """Wait for the client's `http.disconnect`, then abort every child (`stream.cancel()`).

    The body has been read already, so every further ASGI message is either the disconnect or
    (uvicorn, once the response is complete) the same; the caller cancels this task when the
    request finishes first."""
    while (await raw.receive())["type"] != "http.disconnect":
        pass
    g.cancel()
