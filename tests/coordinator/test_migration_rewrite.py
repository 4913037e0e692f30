"""`pdorch.app.migration`: token ids read from SSE bytes, continuation bodies, events rewritten
into the original stream (pure code)."""

from __future__ import annotations

import json
from array import array
from typing import Any

import msgspec
import pytest

from pdorch.app.migration import (
    Continuation,
    StreamTrail,
    continuation_body,
    not_migratable,
    with_token_ids,
)
from pdorch.app.openai_schema import ParsedRequest, RequestKind, parse_request

pytestmark = pytest.mark.unit
MODEL = "m"


def parsed(body: dict[str, Any], kind: RequestKind = "completion") -> ParsedRequest:
    return parse_request(json.dumps({"model": MODEL, **body}).encode(), kind, MODEL)


def event(obj: dict[str, Any]) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def completion_chunk(text: str, ids: list[int], prompt: list[int] | None = None) -> bytes:
    choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
    if prompt is not None:
        choice["prompt_token_ids"] = prompt
    choice["token_ids"] = ids
    return event({"id": "cmpl-x", "object": "text_completion", "created": 7, "model": MODEL,
                  "choices": [choice]})  # fmt: skip


def test_trail_forwards_complete_events_only_and_reads_their_ids() -> None:
    trail = StreamTrail(keep_ids=False)
    first = completion_chunk("a", [5], prompt=[1, 2, 3])
    second = completion_chunk("b", [6, 7])
    out = trail.feed(first + second[:10])
    assert out == first.replace(b"[1,2,3]", b"null").replace(b"[5]", b"null")
    assert trail.pending == second[:10]
    assert trail.feed(second[10:]) == second.replace(b"[6,7]", b"null")
    assert trail.prompt_ids is not None and trail.prompt_ids.tolist() == [1, 2, 3]
    assert trail.output_ids.tolist() == [5, 6, 7]
    assert trail.first_event == first[:-2]
    # a text that looks like the field is escaped JSON: not read
    fake = completion_chunk('"token_ids":[9]', [8])
    out = trail.feed(fake)
    assert b'\\"token_ids\\":[9]' in out and trail.output_ids[-1] == 8


def test_trail_keeps_the_ids_when_the_client_asked_for_them() -> None:
    trail = StreamTrail(keep_ids=True)
    chunk = completion_chunk("a", [5], prompt=[1])
    assert trail.feed(chunk) == chunk


def test_continuation_body_is_prompt_plus_output_with_the_budget_left() -> None:
    trail = StreamTrail(
        keep_ids=False, prompt_ids=array("I", [1, 2]), output_ids=array("I", [3, 4, 5])
    )
    body = continuation_body(
        parsed({"prompt": "hi", "max_tokens": 10, "min_tokens": 4, "seed": 3, "stream": True,
                "temperature": 0.0, "echo": False, "logprobs": 2, "user": "u"}),
        trail,
    )  # fmt: skip
    assert body == {
        "model": MODEL, "prompt": [1, 2, 3, 4, 5], "max_tokens": 7, "min_tokens": 1, "seed": 3,
        "stream": True, "temperature": 0.0, "logprobs": 2, "user": "u", "return_token_ids": True,
    }  # fmt: skip
    # completions' default max_tokens is vLLM's 16; chat's none (the engine's context)
    assert (continuation_body(parsed({"prompt": "hi"}), trail) or {})["max_tokens"] == 13
    chat = parsed({"messages": [{"role": "user", "content": "x"}], "logprobs": False}, "chat")
    chat_body = continuation_body(chat, trail)
    assert chat_body is not None and chat_body["max_tokens"] is None and "messages" not in chat_body
    assert continuation_body(parsed({"prompt": "hi", "max_tokens": 3}), trail) is None
    assert continuation_body(parsed({"prompt": "hi"}), StreamTrail(keep_ids=False)) is None


def test_what_cannot_migrate_is_named() -> None:
    assert not_migratable(parsed({"prompt": "x"})) is None
    assert not_migratable(parsed({"prompt": "x", "echo": True})) == "echo"
    assert not_migratable(parsed({"prompt": "x", "response_format": {"type": "json_object"}})) == (
        "response_format"
    )
    chat = {"messages": [{"role": "user", "content": "x"}]}
    assert not_migratable(parsed({**chat, "tool_choice": "none"}, "chat")) is None
    assert not_migratable(parsed({**chat, "tools": [{"type": "function"}]}, "chat")) == "tools"
    assert not_migratable(parsed({**chat, "logprobs": True}, "chat")) == "logprobs"
    assert with_token_ids({"a": 1}) == {"a": 1, "return_token_ids": True}


def test_continuation_events_become_the_original_streams() -> None:
    trail = StreamTrail(keep_ids=False)
    trail.feed(completion_chunk("a", [5], prompt=[1, 2, 3]))
    cont = Continuation(parsed({"prompt": "p", "stream": True}), trail)
    first = event({"id": "cmpl-y", "object": "text_completion", "created": 9, "model": MODEL,
                   "choices": [{"index": 0, "text": "b", "prompt_token_ids": [1, 2, 3, 5],
                                "token_ids": [6]}]})  # fmt: skip
    usage = event({"id": "cmpl-y", "object": "text_completion", "created": 9, "model": MODEL,
                   "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 1,
                                            "total_tokens": 5}})  # fmt: skip
    out = cont.feed(first + usage + b"data: [DONE]\n\n")
    blocks = [b for b in out.split(b"\n\n") if b]
    a, b = (json.loads(x[len(b"data: ") :]) for x in blocks[:2])
    assert blocks[2] == b"data: [DONE]"
    assert (a["id"], a["created"]) == ("cmpl-x", 7)
    assert a["choices"] == [{"index": 0, "text": "b", "token_ids": None}]
    assert b["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert trail.output_ids.tolist() == [5, 6]


def test_a_chat_stream_continued_on_completions_gets_chat_chunks() -> None:
    trail = StreamTrail(keep_ids=False)
    opening = event({"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 7,
                     "model": MODEL, "choices": [{"index": 0, "delta": {"role": "assistant",
                     "content": ""}}], "prompt_token_ids": [1, 2]})  # fmt: skip
    trail.feed(opening)
    chat = parsed({"messages": [{"role": "user", "content": "x"}], "stream": True}, "chat")
    cont = Continuation(chat, trail)
    out = cont.feed(completion_chunk("zz", [4], prompt=[1, 2]))
    got = json.loads(out[len(b"data: ") :])
    assert got["object"] == "chat.completion.chunk" and got["id"] == "chatcmpl-x"
    assert "prompt_token_ids" not in got
    assert got["choices"] == [
        {"index": 0, "delta": {"content": "zz"}, "logprobs": None, "finish_reason": None,
         "stop_reason": None}
    ]  # fmt: skip
