"""Fuzzing what parses an engine's SSE stream on its way to the client (issue 14 item 3).

The relay (`pdorch.app.migration`: `StreamTrail` on every migratable stream, `Continuation`
on a migrated one; `pdorch.app.legs._is_error_event` on the first chunk) reads bytes an engine
sends, cut wherever TCP cut them. Properties, with hypothesis:

- any chunking of a well-formed stream gives the same bytes out as the whole stream at once,
  only ever complete events, the same token ids read (prompt and output);
- without the client's `return_token_ids` every id list is nulled and nothing else changes;
  with it the bytes pass unchanged;
- a continuation's events come out as events of the original stream (its id, index 0, the
  ids recorded), whatever the chunking;
- arbitrary bytes, and well-formed JSON events of the wrong shape (a buggy or hostile engine),
  never raise out of the relay.

`PDORCH_FUZZ=1` runs the long campaign (benchmarks/results/reliability.md, "Fuzzing").
"""

from __future__ import annotations

import json
import os
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdorch.app.legs import _is_error_event
from pdorch.app.migration import Continuation, StreamTrail
from pdorch.app.openai_schema import RequestKind, parse_request

pytestmark = pytest.mark.unit
LONG = os.environ.get("PDORCH_FUZZ") == "1"
FUZZ = settings(
    max_examples=2000 if LONG else 60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
MODEL = "m"
ids = st.lists(st.integers(0, 2**32 - 1), max_size=4)
text = st.text(max_size=12)  # any unicode: quotes, newlines, "token_ids":[ lookalikes


def _event(obj: Any) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[int], list[int]]:
    """Completion chunks as an engine streams them with `return_token_ids`: the prompt's ids
    on the first, each chunk's ids; then the events, the prompt ids, the output ids."""
    prompt = draw(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=6))
    events: list[dict[str, Any]] = []
    output: list[int] = []
    for i in range(draw(st.integers(1, 6))):
        chunk = draw(ids)
        output += chunk
        choice: dict[str, Any] = {"index": 0, "text": draw(text), "logprobs": None}
        if i == 0:
            choice["prompt_token_ids"] = prompt
        choice["token_ids"] = chunk
        choice["finish_reason"] = None
        events.append({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL,
                       "choices": [choice]})  # fmt: skip
    return events, prompt, output


def _nulled(obj: dict[str, Any]) -> dict[str, Any]:
    choices = [
        {k: (None if k in ("token_ids", "prompt_token_ids") else v) for k, v in c.items()}
        for c in obj["choices"]
    ]
    return {**obj, "choices": choices}


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    pieces, start = [], 0
    for point in points:
        pieces.append(data[start:point])
        start = point
    pieces.append(data[start:])
    return pieces


@FUZZ
@given(stream=streams(), cuts=st.lists(st.integers(0, 4000), max_size=12), keep=st.booleans())
def test_any_chunking_gives_the_same_events_and_ids(
    stream: tuple[list[dict[str, Any]], list[int], list[int]], cuts: list[int], keep: bool
) -> None:
    events, prompt, output = stream
    tail = [b"data: [DONE]\n\n"]
    data = b"".join([*map(_event, events), *tail])
    trail = StreamTrail(keep_ids=keep)
    out = []
    for piece in _cut(data, cuts):
        got = trail.feed(piece)
        assert not got or got.endswith(b"\n\n")  # only complete events reach the client
        out.append(got)
    assert trail.pending == b""
    expected = data if keep else b"".join([*(_event(_nulled(e)) for e in events), *tail])
    assert b"".join(out) == expected
    assert trail.prompt_ids is not None and trail.prompt_ids.tolist() == prompt
    assert trail.output_ids.tolist() == output


@FUZZ
@given(
    first=streams(),
    continued=streams(),
    cuts=st.lists(st.integers(0, 4000), max_size=12),
    chat=st.booleans(),
)
def test_a_continuation_reads_as_the_original_stream(
    first: tuple[list[dict[str, Any]], list[int], list[int]],
    continued: tuple[list[dict[str, Any]], list[int], list[int]],
    cuts: list[int],
    chat: bool,
) -> None:
    body = {"model": MODEL, "stream": True}
    if chat:
        parsed = parse_request(
            json.dumps({**body, "messages": [{"role": "user", "content": "x"}]}).encode(),
            "chat",
            MODEL,
        )
    else:
        parsed = parse_request(json.dumps({**body, "prompt": "x"}).encode(), "completion", MODEL)
    trail = StreamTrail(keep_ids=False)
    original = {"id": "orig-7", "object": "x.chunk", "created": 9, "model": MODEL, "choices": []}
    trail.feed(_event(original))
    trail.feed(b"".join(map(_event, first[0])))
    before = trail.output_ids.tolist()
    continuation = Continuation(parsed, trail)
    data = b"".join(map(_event, continued[0])) + b"data: [DONE]\n\n"
    out = b"".join(continuation.feed(piece) for piece in _cut(data, cuts))
    assert continuation.pending == b""
    blocks = [b for b in out.split(b"\n\n") if b]
    assert blocks[-1] == b"data: [DONE]"
    for block in blocks[:-1]:
        obj = json.loads(block[len(b"data: ") :])
        assert obj["id"] == "orig-7" and obj["created"] == 9
        assert [c["index"] for c in obj["choices"]] == [0]
    assert len(blocks) == len(continued[0]) + 1
    assert trail.output_ids.tolist() == before + continued[2]


junk_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
wrong_events = st.fixed_dictionaries(
    {},
    optional={
        "id": junk_values,
        "choices": junk_values
        | st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "text": junk_values,
                    "token_ids": junk_values,
                    "finish_reason": junk_values,
                    "prompt_token_ids": junk_values,
                },
            ),
            max_size=2,
        ),
        "usage": junk_values
        | st.fixed_dictionaries({}, optional={"completion_tokens": junk_values}),
        "error": junk_values,
        "prompt_token_ids": junk_values,
    },
)


@FUZZ
@given(
    chunks=st.lists(
        st.binary(max_size=200)
        | wrong_events.map(_event)
        | st.sampled_from([b"data: ", b"\n\n", b'token_ids":[', b'"prompt_token_ids":[1,', b"]"]),
        max_size=8,
    ),
    keep=st.booleans(),
    chat=st.booleans(),
)
def test_garbage_from_an_engine_never_raises_out_of_the_relay(
    chunks: list[bytes], keep: bool, chat: bool
) -> None:
    trail = StreamTrail(keep_ids=keep)
    kind: RequestKind = "chat" if chat else "completion"
    request = (
        {"model": MODEL, "messages": [{"role": "u"}]} if chat else {"model": MODEL, "prompt": "x"}
    )
    parsed = parse_request(json.dumps(request).encode(), kind, MODEL)
    for chunk in chunks:
        _is_error_event(chunk)
        out = trail.feed(chunk)
        assert not out or out.endswith(b"\n\n")
    continuation = Continuation(parsed, trail)
    for chunk in chunks:
        out = continuation.feed(chunk)
        assert not out or out.endswith(b"\n\n")


def test_a_continuation_event_of_the_wrong_shape_passes_as_sent() -> None:
    """Found by the property above: `{"choices": true}`, a choice that is no object, a usage
    count that is no number raised out of `Continuation.feed` (on a continuation's first chunk
    that broke the client's stream without an error event or [DONE])."""
    parsed = parse_request(b'{"model": "m", "prompt": "x", "stream": true}', "completion", MODEL)
    trail = StreamTrail(keep_ids=False)
    trail.feed(_event({"id": "o", "created": 1, "choices": []}))
    continuation = Continuation(parsed, trail)
    for wrong in (
        {"choices": True},
        {"choices": [None]},
        {"choices": [], "usage": {"completion_tokens": [1]}},
        {"choices": [], "usage": {"completion_tokens": ":"}},
    ):
        assert continuation.feed(_event(wrong)) == _event(wrong)
    good = _event({"choices": [{"text": "a", "token_ids": [4]}]})
    assert json.loads(continuation.feed(good)[len(b"data: ") :])["id"] == "o"
    assert trail.output_ids.tolist()[-1] == 4
