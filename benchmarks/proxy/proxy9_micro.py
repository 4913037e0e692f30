"""Microbenchmarks of proxy-9's cuts on the whole-answer path (`benchmarks/results/proxy.md`).

    python -m benchmarks.proxy.proxy9_micro [CALLS]

Each row times the way the hot path did it before a cut and the way it does it now, in the
same process, µs per request, min of 5 repeats of CALLS (default 20,000), before and after
taking turns repeat by repeat (so a load spike on a shared box hits both alike). The "before"
side is the old code written out here; the "after" side calls the product's functions.

- `body read`: starlette's `Request.stream()` (async generator) + a `Headers` lookup of
  Content-Length vs `leg_wait.read_body` (the ASGI `receive` directly), on a one-message body.
- `routing headers`: three `request.headers.get` (priority twice, session) vs one pass over
  the raw headers (`flow._routing_headers`), on a request's typical seven headers.
- `local tokenizer scope`: the chars tokenizer's tokens inside an `asyncio.timeout(None)` and
  the waiting set (what `PromptTokens.tokens` does for every tokenizer) vs without, a
  480-character ASCII prompt, on uvloop; the tokenizer itself is the new one on both sides.
  Measured -0.6 µs (no gain, proxy-9): the cut was dropped, the row stays as the evidence.
- `chars tokens`: a str slice + encode per 4 characters vs the ASCII text encoded once
  (`CharsPromptTokenizer.encode_text`), the same prompt.
- `answer Response`: starlette's `Response(content, headers=dict, media_type=...)` vs
  `edge_answer.whole_response` with the flow's raw route headers.
- `prefill answer`: the whole answer decoded, `kv_transfer_params` re-encoded vs only the
  params read as raw bytes (`legs._decode_prefill`), on a vLLM-shaped prefill answer; the
  params' check (`kv_transfer_params_of`) runs on both sides.
"""

from __future__ import annotations

import asyncio
import sys
import timeit
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import uvloop
from starlette.requests import Request
from starlette.responses import Response

from pdorch.app.admission import PRIORITY_HEADER
from pdorch.app.edge_answer import whole_response
from pdorch.app.flow import SESSION_HEADER, _routing_headers
from pdorch.app.leg_wait import read_body
from pdorch.app.legs import _decode_prefill
from pools.pd_protocol import kv_transfer_params_of
from router.tokenization import CharsPromptTokenizer

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
BODY = b'{"model":"tiny","prompt":"' + b"hello world " * 40 + b'","max_tokens":4}'
HEADERS = [
    (b"host", b"127.0.0.1:8000"),
    (b"user-agent", b"bench/1.0"),
    (b"accept", b"*/*"),
    (b"accept-encoding", b"gzip, deflate"),
    (b"connection", b"keep-alive"),
    (b"content-type", b"application/json"),
    (b"content-length", str(len(BODY)).encode()),
]
PROMPT = "hello world " * 40
PREFILL_ANSWER = _encode(
    {
        "id": "cmpl-0123456789abcdef",
        "object": "text_completion",
        "created": 1764800000,
        "model": "tiny",
        "choices": [
            {"index": 0, "text": " a", "logprobs": None, "finish_reason": "length"},
        ],
        "usage": {"prompt_tokens": 120, "total_tokens": 121, "completion_tokens": 1},
        "kv_transfer_params": {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [1, 2, 3, 4],
            "remote_engine_id": "engine-0",
            "remote_host": "127.0.0.1",
            "remote_port": 5600,
            "tp_size": 1,
        },
    }
)
ANSWER = b'{"id":"cmpl-1","object":"text_completion","choices":[{"text":" a b c d"}]}'
ROUTE = {
    "x-request-id": "pdorch-0123456789abcdef0000000000000001",
    "x-pdorch-prefill": "p0",
    "x-pdorch-decode": "d0",
    "x-pdorch-route": "pd",
}
ROUTE_RAW = [(k.encode(), v.encode()) for k, v in ROUTE.items()]


def _scope() -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/v1/completions", "headers": HEADERS}


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": BODY, "more_body": False}


async def _body_before(n: int) -> None:
    for _ in range(n):
        request = Request(_scope(), _receive)
        length = request.headers.get("content-length")
        assert length is not None and int(length) <= 1 << 20
        chunks = [chunk async for chunk in request.stream()]
        b"".join(chunks)


async def _body_after(n: int) -> None:
    for _ in range(n):
        await read_body(Request(_scope(), _receive), 1 << 20)


def _headers_before(n: int) -> None:
    for _ in range(n):
        request = Request(_scope(), _receive)
        request.headers.get(PRIORITY_HEADER)
        request.headers.get(SESSION_HEADER)
        request.headers.get(PRIORITY_HEADER)


def _headers_after(n: int) -> None:
    for _ in range(n):
        request = Request(_scope(), _receive)
        _routing_headers(request.scope["headers"])


_TOKENIZER = CharsPromptTokenizer()


async def _scope_before(n: int) -> None:
    waiting: dict[str, set[asyncio.Timeout]] = {}
    for _ in range(n):
        async with asyncio.timeout(None) as hung:
            calls = waiting.setdefault("", set())
            calls.add(hung)
            try:
                await _TOKENIZER.encode_completion(PROMPT)
            finally:
                calls.discard(hung)
                if not calls:
                    waiting.pop("", None)


async def _scope_after(n: int) -> None:
    for _ in range(n):
        await _TOKENIZER.encode_completion(PROMPT)


def _chars_before(n: int) -> None:
    from xxhash import xxh3_64_intdigest

    for _ in range(n):
        [
            xxh3_64_intdigest(PROMPT[i : i + 4].encode("utf-8")) & 0x7FFFFFFF
            for i in range(0, len(PROMPT), 4)
        ]


def _chars_after(n: int) -> None:
    encode = _TOKENIZER.encode_text
    for _ in range(n):
        encode(PROMPT)


def _response_before(n: int) -> None:
    for _ in range(n):
        Response(ANSWER, status_code=200, media_type="application/json", headers=dict(ROUTE))


def _response_after(n: int) -> None:
    for _ in range(n):
        whole_response(ANSWER, "application/json", list(ROUTE_RAW))


def _prefill_before(n: int) -> None:
    for _ in range(n):
        answer = _decode(PREFILL_ANSWER)
        kv_transfer_params_of(answer)
        _encode(answer["kv_transfer_params"])


def _prefill_after(n: int) -> None:
    for _ in range(n):
        wire = bytes(_decode_prefill(PREFILL_ANSWER).kv_transfer_params)
        kv_transfer_params_of({"kv_transfer_params": _decode(wire)})


def _timed(run: Callable[[int], Any], n: int, loop: asyncio.AbstractEventLoop | None) -> float:
    if loop is None:
        return timeit.timeit(lambda: run(n), number=1) / n * 1e6
    coro: Callable[[], Awaitable[None]] = lambda: run(n)  # noqa: E731
    return timeit.timeit(lambda: loop.run_until_complete(coro()), number=1) / n * 1e6


def main(calls: int) -> None:
    loop = uvloop.new_event_loop()
    rows: list[tuple[str, Callable[[int], Any], Callable[[int], Any], bool]] = [
        ("body read", _body_before, _body_after, True),
        ("routing headers", _headers_before, _headers_after, False),
        ("local tokenizer scope", _scope_before, _scope_after, True),
        ("chars tokens", _chars_before, _chars_after, False),
        ("answer Response", _response_before, _response_after, False),
        ("prefill answer", _prefill_before, _prefill_after, False),
    ]
    print(f"{'cut':24} {'before µs':>10} {'after µs':>10} {'saved µs':>10}")
    total = 0.0
    for name, before, after, on_loop in rows:
        on = loop if on_loop else None
        b: list[float] = []
        a: list[float] = []
        for _ in range(5):
            b.append(_timed(before, calls, on))
            a.append(_timed(after, calls, on))
        saved = min(b) - min(a)
        total += saved
        print(f"{name:24} {min(b):10.2f} {min(a):10.2f} {saved:10.2f}")
    print(f"{'total':24} {'':10} {'':10} {total:10.2f}")
    loop.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
