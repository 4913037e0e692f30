"""Decode-stream migration (issue 14): a request whose decode engine dies or stalls mid-answer
goes on on another decode replica from its prompt plus the tokens already streamed, so the
client sees one unbroken stream (the semantics of Dynamo's request migration; our own code).

How the coordinator knows the token ids: the decode leg of a migratable request carries
`return_token_ids: true` (vLLM ≥ 0.10.2, and 0.32's `CompletionRequest` /
`ChatCompletionRequest`; the simulated engine answers it the same way). Then every streamed
choice carries its `token_ids` and the prompt's ids come once (completions:
`choices[0].prompt_token_ids` of the first token event; chat: top-level `prompt_token_ids` of
the opening role event). Text alone would not do: re-tokenizing generated text need not give
back the generated ids, and logprobs name tokens by text. `StreamTrail` reads the ids from
each complete SSE event with one regular expression over the bytes (no JSON decode on the
hot path) and, unless the client asked for `return_token_ids` itself, nulls them out
(`"token_ids":null`, what vLLM sends without the flag), so the client gets the bytes it would
have got.

The continuation (`continuation_body`): `POST /v1/completions` with `prompt` = the prompt's ids
+ every output id streamed so far, `max_tokens` less what was streamed (completions' default
16 when absent, as vLLM; `null` for chat without a limit: the engine's remaining context),
`min_tokens` less
too, and the original's sampling fields (`SAMPLING_FIELDS`), `stream_options` and the same
`return_token_ids`. Greedy decoding is then deterministic: the continuation's tokens are
those the uninterrupted run would have produced (a seeded non-greedy run is on the simulated
engine, whose tokens are a function of seed + sequence; on vLLM the seeded generator restarts
at the continuation, so its draws differ). It runs as a *local* leg (the new decode replica
prefills prompt + output itself) and not as a P/D leg: migrations are rare, the prompt prefix
is often cached nowhere but the dead replica, a P/D leg would add a prefill hop and a KV
transfer to the client's longest wait, and it would also depend on the prefill pool while the
fleet is already degraded. Chat requests continue on `/v1/completions` too (the chat template
was applied already: its ids are the prompt), and `Continuation` turns its events into chat
chunks.

`Continuation` rewrites the continuation's events into the original stream: the original
`id`, `object`, `created`, `model`; choice index 0; completions' `prompt_token_ids` dropped
(sent once already); usage (the final event with `stream_options.include_usage`, and every
event with `continuous_usage_stats`): `prompt_tokens` the original prompt's, `completion_tokens`
everything streamed (before + the continuation's), `total_tokens` their sum. An error event or
`[DONE]` passes unchanged. Only complete events are forwarded while a stream may migrate, so a
half-sent event of the dead engine never reaches the client.

Cost: the trail is ~2 µs CPU per chunk (`bytes.find` scans and slices; measured with
`time.process_time` on the shared 2-core box at load ~17, where `bytes.count` of the same
chunk took 0.2 µs) and 4 bytes per token held (uint32 arrays) for the stream's life;
`migration_limit: 0` turns it off (no `return_token_ids`, bytes pass as read). With
`return_token_ids` vLLM's chat stream also sends a chunk when a parser holds text back (an
empty delta): the client may see such chunks. Dynamo's migration is off by default
(`--migration-limit 0`) and can stop tracking past `--migration-max-seq-len`; ours is on
(limit 3: streams survive their engine by default) and has no length cap.

Not migratable (`not_migratable`; the stream then ends with an error event as before):
`echo`, `best_of` > 1, `n` > 1, `suffix`, tools / tool_choice / functions, `response_format`
other than text, structured outputs (`guided_*`, `structured_outputs`), `logprobs` (chat's
differ in shape; completions' `text_offset` of a continuation would restart at 0). A stop
string that straddles the migration point is not seen (each engine checks its own text).
Server-side parsers (reasoning, tool calls) of chat are not re-applied to the continuation.
"""

from __future__ import annotations

import contextlib
from array import array
from dataclasses import dataclass, field
from typing import Any

import msgspec

from pdorch.app.openai_schema import ParsedRequest

_decode_json = msgspec.json.Decoder().decode
_encode_json = msgspec.json.Encoder().encode
COMPLETIONS_PATH = "/v1/completions"
DEFAULT_COMPLETION_MAX_TOKENS = 16  # vLLM's CompletionRequest default (OpenAI's too)
# the original's sampling parameters the continuation keeps (vLLM's SamplingParams fields)
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "bad_words",
    "allowed_token_ids",
    "cache_salt",
    "priority",
    "user",
    "stream",
    "stream_options",
)
_NOT_MIGRATABLE = (
    "echo",
    "suffix",
    "tools",
    "functions",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
)
# `"token_ids":[...]` / `"prompt_token_ids":[...]` as vLLM (pydantic) and the simulated engine
# (msgspec) write them: no spaces. A generated text cannot fake it: its quotes are escaped.
# Found with `bytes.find` (a regex costs ~10x more per chunk: it tries every position).
_KEY = b'token_ids":['
_PROMPT_KEY = b'"prompt_'
_EVENT_END = b"\n\n"
_QUOTE = ord('"')


def not_migratable(parsed: ParsedRequest) -> str | None:
    """Why this request cannot be continued elsewhere (None: it can); module docstring."""
    body = parsed.body
    for name in _NOT_MIGRATABLE:
        value = body.get(name)
        if value is not None and value is not False and value != []:
            return name
    if isinstance(body.get("best_of"), int) and body["best_of"] > 1:
        return "best_of"
    if parsed.n > 1:  # the trail reads one sequence; n choices interleave n of them
        return "n"
    choice = body.get("tool_choice")
    if choice is not None and choice != "none":
        return "tool_choice"
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        return "response_format"
    if parsed.kind == "chat" and (body.get("logprobs") or body.get("top_logprobs")):
        return "logprobs"
    if parsed.kind == "completion" and body.get("logprobs") is not None:
        # the continuation's `text_offset`s would restart at 0 (they count from its own
        # output), and the trail does not know the text length streamed before
        return "logprobs"
    return None


def with_token_ids(body: dict[str, Any]) -> dict[str, Any]:
    """The decode leg's body asking for the token ids (module docstring)."""
    if body.get("return_token_ids") is True:
        return body
    return {**body, "return_token_ids": True}


def _ids(raw: bytes) -> list[int]:
    try:
        if b"," not in raw:  # one token per step: the usual chunk
            return [int(raw)] if raw else []
        return [int(t) for t in raw.split(b",")]
    except ValueError:  # not a list of ids after all
        return []


@dataclass(slots=True)
class StreamTrail:
    """What the client got of one stream: complete SSE events only, and their token ids.

    `feed(chunk)` returns the complete events the chunk finishes (the rest waits in
    `pending`) with the ids nulled unless `keep_ids`; `prompt_ids` / `output_ids` grow."""

    keep_ids: bool  # the client asked for return_token_ids itself
    # uint32 arrays: 4 bytes a token (a list of ints costs ~8-36), held for the whole stream
    prompt_ids: array[int] | None = None
    output_ids: array[int] = field(default_factory=lambda: array("I"))
    pending: bytes = b""
    first_event: bytes = b""  # the original's first event: its id, created, model

    def feed(self, chunk: bytes) -> bytes:
        if not self.pending and chunk.endswith(_EVENT_END):
            done = chunk  # the usual read: whole events
        else:
            data = self.pending + chunk
            end = data.rfind(_EVENT_END)
            if end < 0:
                self.pending = data
                return b""
            end += len(_EVENT_END)
            done, self.pending = data[:end], data[end:]
        if not self.first_event:
            self.first_event = done[: done.find(_EVENT_END)]
        return self.record(done)

    def record(self, events: bytes) -> bytes:
        """Read the ids of `events`; the events with them nulled unless `keep_ids`."""
        at = events.find(_KEY)
        if at < 0:
            return events
        n = len(_KEY)
        end = events.find(b"]", at + n)
        if end >= 0 and at > 0 and events[at - 1] == _QUOTE and events.find(_KEY, end) < 0:
            # the usual chunk: one token event, one output id list (no prompt ids): no loop,
            # no list of parts (the relay's per-event cost, `benchmarks/results/proxy.md`)
            raw = events[at + n : end]
            try:
                if b"," in raw or not raw:
                    self.output_ids.extend(_ids(raw))
                else:
                    self.output_ids.append(int(raw))
            except (OverflowError, ValueError):  # not uint32 ids / not ids: skip
                pass
            if self.keep_ids:
                return events
            return b"".join((events[: at + n - 1], b"null", events[end + 1 :]))
        return self._record_all(events, at)

    def _record_all(self, events: bytes, at: int) -> bytes:
        """`record` for several id lists (several events, or the prompt's ids too)."""
        parts: list[bytes] = []
        start = 0
        n = len(_KEY)
        while at >= 0:
            end = events.find(b"]", at + n)
            if end < 0:
                break
            prompt = events[at - len(_PROMPT_KEY) : at] == _PROMPT_KEY
            if prompt or events[at - 1 : at] == b'"':
                raw = events[at + n : end]
                if prompt:
                    if self.prompt_ids is None:
                        with contextlib.suppress(OverflowError):
                            self.prompt_ids = array("I", _ids(raw))
                else:
                    with contextlib.suppress(OverflowError):  # not uint32 ids: skip
                        self.output_ids.extend(_ids(raw))
                if not self.keep_ids:
                    parts.append(events[start : at + n - 1])
                    parts.append(b"null")
                    start = end + 1
            at = events.find(_KEY, end)
        if not parts:
            return events
        parts.append(events[start:])
        return b"".join(parts)


def continuation_body(parsed: ParsedRequest, trail: StreamTrail) -> dict[str, Any] | None:
    """The `/v1/completions` body that continues the stream (module docstring); None when it
    cannot: no prompt ids seen, or nothing left to generate."""
    if trail.prompt_ids is None:
        return None
    src = parsed.body
    body: dict[str, Any] = {k: src[k] for k in SAMPLING_FIELDS if k in src}
    body["model"] = src["model"]
    body["prompt"] = trail.prompt_ids.tolist() + trail.output_ids.tolist()
    done = len(trail.output_ids)
    limit = parsed.max_tokens
    if limit is None and parsed.kind == "completion" and "max_tokens" not in src:
        limit = DEFAULT_COMPLETION_MAX_TOKENS
    if limit is not None and limit - done < 1:
        return None
    # explicit null for "the context left": an absent field is completions' default 16
    body["max_tokens"] = None if limit is None else limit - done
    min_tokens = src.get("min_tokens")
    if isinstance(min_tokens, int) and min_tokens > 0:
        body["min_tokens"] = max(0, min_tokens - done)
    if parsed.kind == "completion" and src.get("logprobs") is not None:
        body["logprobs"] = src["logprobs"]
    body["return_token_ids"] = True
    return body


class Continuation:
    """Turns a continuation's SSE events into events of the original stream (module
    docstring); records their ids in the trail, so a later migration goes on from them."""

    def __init__(self, parsed: ParsedRequest, trail: StreamTrail) -> None:
        self.trail = trail
        self.chat = parsed.kind == "chat"
        first: dict[str, Any] = {}
        if trail.first_event.startswith(b"data: {"):
            try:
                decoded = _decode_json(trail.first_event[len(b"data: ") :])
            except msgspec.DecodeError:
                decoded = {}
            if isinstance(decoded, dict):
                first = decoded
        self.identity = {k: first[k] for k in ("id", "object", "created", "model") if k in first}
        self.prompt_tokens = len(trail.prompt_ids or ())
        self.carried = len(trail.output_ids)  # output tokens streamed before this leg
        self.pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.pending + chunk if self.pending else chunk
        end = data.rfind(_EVENT_END)
        if end < 0:
            self.pending = data
            return b""
        end += len(_EVENT_END)
        done, self.pending = data[:end], data[end:]
        out: list[bytes] = []
        for event in done.split(_EVENT_END):
            if not event:
                continue
            try:
                rewritten = self._event(event)
            except (AttributeError, TypeError, ValueError):  # JSON of the wrong shape
                rewritten = event  # passes as sent, like an event that is not JSON
            if rewritten is not None:
                out.append(rewritten + _EVENT_END)
        return b"".join(out)

    def _event(self, event: bytes) -> bytes | None:
        if not event.startswith(b"data: {"):
            return event  # [DONE], comments
        try:
            obj = _decode_json(event[len(b"data: ") :])
        except msgspec.DecodeError:
            return event
        if not isinstance(obj, dict) or "error" in obj:
            return event
        keep = self.trail.keep_ids
        choices = []
        for choice in obj.get("choices") or ():
            ids = choice.get("token_ids")
            if isinstance(ids, list):
                with contextlib.suppress(TypeError, OverflowError):  # not uint32 ids: skip
                    self.trail.output_ids.extend(ids)
            if self.chat:
                text = choice.get("text") or ""
                new: dict[str, Any] = {
                    "index": 0,
                    "delta": {"content": text} if text else {},
                    "logprobs": None,
                    "finish_reason": choice.get("finish_reason"),
                    "stop_reason": choice.get("stop_reason"),
                }
                if keep:
                    new["token_ids"] = ids
            else:
                new = dict(choice)
                new["index"] = 0
                new.pop("prompt_token_ids", None)
                new["token_ids"] = ids if keep else None
            choices.append(new)
        if not choices and "usage" not in obj:
            return None
        obj["choices"] = choices
        obj.update(self.identity)
        obj.pop("prompt_token_ids", None)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            generated = self.carried + int(usage.get("completion_tokens") or 0)
            usage["prompt_tokens"] = self.prompt_tokens
            usage["completion_tokens"] = generated
            usage["total_tokens"] = self.prompt_tokens + generated
        return b"data: " + _encode_json(obj)
