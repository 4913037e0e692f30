"""A batch of prompts in one `/v1/completions` request: one P/D flow per prompt, one answer.

vLLM serves `prompt: [p0, p1, ...]` as one request per prompt inside one engine; pdorch routes
each prompt on its own (its own prefix-cache overlap, prefill and decode replicas, KV transfer,
retries and migration), as a `RequestFlow` of its own (`{request id}-{i}`, `X-Request-Id`
upstream too) run concurrently, and merges the answers into the shape vLLM gives:

- choices indexed prompt-major: prompt `i`'s choice `j` is `index = i * n + j`;
- one `id`, `object`, `created` and `model` (the first prompt's answer's);
- `usage` summed over the prompts (`prompt_tokens`, `completion_tokens`, `total_tokens`);
- streamed: every prompt's events as they come, re-indexed and carrying the first prompt's
  `id`/`created`; the per-prompt usage events (`stream_options.include_usage`) are held back
  and one summed usage event ends the stream before the one `data: [DONE]`. Per-chunk usage
  (`continuous_usage_stats`) stays per prompt, as vLLM sends it.

Failures: a prompt whose flow fails before answering fails the batch (vLLM answers one error
for the whole batch too): the other flows are closed and the first error goes back as it came
(an OpenAI error, or the engine's 4xx unchanged). Streamed, a prompt's stream that ends with
an error event (its decode replica failed mid-stream and it could not be continued) ends the
merged stream with that event and `[DONE]`; the other flows are closed.

Bookkeeping: each prompt's flow holds its own token load, drain tracking and route metrics; the
client request (the parent flow) holds one admission slot and is counted once in
`pdorch_requests_total`. Response headers name, per prompt in order, comma-separated, the
prefill and decode replicas and the route kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from pdorch.app.errors import ApiError
from pdorch.app.proxy_stream import ProxyStream

if TYPE_CHECKING:
    from pdorch.app.flow import RequestFlow

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_DONE = b"data: [DONE]"
_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")
_QUEUE_EVENTS = 16  # chunks buffered between the prompt streams and the client
log = logging.getLogger(__name__)


async def fan_out(parent: RequestFlow) -> Response:
    """Serve `parent`'s batch (module docstring); raises `ApiError` like `RequestFlow._legs`."""
    parsed = parent.parsed
    assert parsed is not None and parsed.batch is not None
    flows = []
    for i, prompt in enumerate(parsed.batch):
        flow = type(parent)(parent.c, parent.kind, parent.http, f"{parent.request_id}-{i}")
        flow.parsed = parsed.for_prompt(prompt)
        flow.counted = False
        flows.append(flow)
    results = await asyncio.gather(*(_run_one(f) for f in flows), return_exceptions=True)
    failure: BaseException | Response | None = None
    for result in results:
        if isinstance(result, BaseException) or result.status_code != 200:
            failure = result
            break
    if failure is not None:
        for result in results:
            if isinstance(result, ProxyStream):
                await result.close_unsent()
        if isinstance(failure, Response):
            return failure
        raise failure
    headers = _headers(parent, flows)
    if parsed.stream:
        streams = [r for r in results if isinstance(r, ProxyStream)]
        return BatchStream(parent, streams, parsed.n, headers)
    bodies = [bytes(r.body) for r in results if isinstance(r, Response)]
    return Response(merge_whole(bodies, parsed.n), media_type="application/json", headers=headers)


async def _run_one(flow: RequestFlow) -> Response:
    """One prompt's flow, up to its answer (streamed: its open `ProxyStream`). A non-streamed
    flow, or one that failed, is finished here; a stream is finished when it closes. A drain
    that cuts the flow before it answers cancels this task (`RequestFlow.cut`): 503."""
    flow._work = asyncio.current_task()
    response: Response | None = None
    status = 500
    try:
        response = await flow._legs()
        status = response.status_code
        return response
    except ApiError as err:
        status = err.status
        raise
    except asyncio.CancelledError:
        if flow._cut_cancel:
            status = 503
            raise ApiError(
                503, f"Request ended early: {flow.cut_reason}.", code="replica_drained"
            ) from None
        raise
    finally:
        flow._work = None
        if not isinstance(response, ProxyStream):
            flow._finish(ok=status == 200, status=status)


def _headers(parent: RequestFlow, flows: list[RequestFlow]) -> dict[str, str]:
    def each(name: str) -> str:
        return ",".join(f.route_headers()[name] for f in flows)

    return {
        "x-request-id": parent.request_id,
        "x-pdorch-prefill": each("x-pdorch-prefill"),
        "x-pdorch-decode": each("x-pdorch-decode"),
        "x-pdorch-route": each("x-pdorch-route"),
    }


def _add_usage(total: dict[str, int], usage: Any) -> None:
    if isinstance(usage, dict):
        for key in _USAGE_FIELDS:
            value = usage.get(key)
            if isinstance(value, int):
                total[key] = total.get(key, 0) + value


def merge_whole(bodies: list[bytes], n: int) -> bytes:
    """The non-streamed answers of a batch's prompts as one (module docstring)."""
    merged: dict[str, Any] | None = None
    choices: list[Any] = []
    usage: dict[str, int] = {}
    for i, raw in enumerate(bodies):
        answer = _decode(raw)
        if not isinstance(answer, dict):
            raise ApiError(502, f"prompt {i}: the engine's answer is not a JSON object")
        for choice in answer.get("choices") or ():
            if isinstance(choice, dict):
                choice["index"] = i * n + int(choice.get("index") or 0)
                choices.append(choice)
        _add_usage(usage, answer.get("usage"))
        if merged is None:
            merged = answer
    assert merged is not None
    choices.sort(key=lambda c: int(c["index"]))
    merged["choices"] = choices
    if isinstance(merged.get("usage"), dict):
        merged["usage"].update(usage)
    merged.pop("kv_transfer_params", None)  # the P/D hand-off is not the client's
    return _encode(merged)


class StreamMerge:
    """Re-indexes one prompt's SSE events into the merged stream (module docstring)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.identity: dict[str, Any] = {}  # the first prompt's first event's id, created
        self.usage: dict[str, int] = {}
        self.saw_usage = False
        self.object: Any = "text_completion"
        self.model: Any = None
        self.error: bytes | None = None

    def events(self, prompt: int, data: bytes) -> list[bytes]:
        """The merged stream's events (each `data: ...\\n\\n`) for complete `data` events."""
        out: list[bytes] = []
        for event in data.split(b"\n\n"):
            if not event or event.startswith(_DONE):
                continue
            if not event.startswith(b"data: {"):
                out.append(event + b"\n\n")
                continue
            try:
                obj = _decode(event[len(b"data: ") :])
            except msgspec.DecodeError:
                out.append(event + b"\n\n")
                continue
            if not isinstance(obj, dict):
                continue
            if "error" in obj:
                self.error = event + b"\n\n"
                continue
            if not self.identity:
                self.identity = {k: obj[k] for k in ("id", "created") if k in obj}
                self.object = obj.get("object", self.object)
                self.model = obj.get("model")
            choices = obj.get("choices")
            if not choices and "usage" in obj:  # the prompt's final usage event: summed later
                self.saw_usage = True
                _add_usage(self.usage, obj["usage"])
                continue
            for choice in choices or ():
                if isinstance(choice, dict):
                    choice["index"] = prompt * self.n + int(choice.get("index") or 0)
            obj.update(self.identity)
            out.append(b"data: " + _encode(obj) + b"\n\n")
        return out

    def usage_event(self) -> bytes:
        body = {
            **self.identity,
            "object": self.object,
            "model": self.model,
            "choices": [],
            "usage": self.usage,
        }
        return b"data: " + _encode(body) + b"\n\n"


class BatchStream(StreamingResponse):
    """The merged SSE answer of a batch's prompt streams (module docstring)."""

    def __init__(
        self, parent: RequestFlow, streams: list[ProxyStream], n: int, headers: dict[str, str]
    ) -> None:
        self.parent = parent
        self.streams = streams
        self.merge = StreamMerge(n)
        self.completed = False
        self._tasks: list[asyncio.Task[None]] = []
        # kept typed as a generator: `__call__` closes it, `body_iterator` is only an iterator
        self._merged = self._body()
        super().__init__(
            self._merged,
            status_code=200,
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache"},
        )

    async def _body(self) -> AsyncGenerator[bytes, None]:
        # bounded: a slow client holds the prompt streams in their `yield` (ProxyStream does
        # not count that as the engine's silence) instead of growing a buffer
        queue: asyncio.Queue[tuple[int, bytes | None]] = asyncio.Queue(maxsize=_QUEUE_EVENTS)

        async def pump(i: int, stream: ProxyStream) -> None:
            pending = b""
            try:
                async for chunk in stream.body_iterator:
                    data = pending + (chunk.encode() if isinstance(chunk, str) else bytes(chunk))
                    end = data.rfind(b"\n\n")
                    if end < 0:
                        pending = data
                        continue
                    pending = data[end + 2 :]
                    await queue.put((i, data[: end + 2]))
            except Exception:  # ProxyStream ends every failure itself: this is a bug
                log.exception("batch %s: prompt %d's stream failed", self.parent.request_id, i)
            await queue.put((i, None))  # not when cancelled: nobody waits for it then

        self._tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(self.streams)]
        live = len(self._tasks)
        merge = self.merge
        while live:
            i, data = await queue.get()
            if data is None:
                live -= 1
                continue
            out = merge.events(i, data)
            if out:
                yield b"".join(out)
            if merge.error is not None:
                yield merge.error + _DONE + b"\n\n"
                return
        if merge.saw_usage:
            yield merge.usage_event()
        yield _DONE + b"\n\n"
        self.completed = all(s.completed for s in self.streams)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self._merged.aclose()
            for stream in self.streams:
                await stream.close_unsent()
            self.parent._finish(ok=self.completed, status=200)
