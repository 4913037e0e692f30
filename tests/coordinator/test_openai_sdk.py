"""Issue 16 item 2: the OpenAI surface through the P/D flow, driven by the official `openai` SDK.

A real coordinator over real simulated engines (1 prefill + 1 decode, in process, real HTTP and
KV transfer); the SDK's async client runs on the test's loop, its sync client in a thread (it
blocks). Checked: `n > 1` (one prefill, `n` choices from the decode engine), batches of
prompts (one P/D flow each, one answer indexed prompt-major, usage summed), streamed and not,
`stream_options.include_usage`, `echo`, `logprobs` (completions and chat), the passthrough
routes (`/tokenize`, `/detokenize`; `/v1/embeddings` and `/v1/responses` forwarded to the one
replica that serves them, OpenAI 404s where none does) and the OpenAI-shaped refusals of what
pdorch does not serve.

The simulated engine's output is a function of (seed, sequence), and vLLM's parallel sampling
seeds choice `j` with `seed + j`: so choice `j` of any request equals the `n = 1` answer with
seed `seed + j`, which is what the fan-out and the `n` choices are checked against.
"""

from __future__ import annotations

import asyncio
import base64
import json
from array import array
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from starlette.responses import Response, StreamingResponse

from pdorch.app.migration import not_migratable
from pdorch.app.openai_schema import parse_request
from pdorch.app.server import RunningCoordinator, run_coordinator
from pdorch.config.fleet import parse_fleet_config
from pools.inloop_server import InLoopHttpServer
from tests.coordinator.helpers import EXTERNAL, MODEL, engine_metric, fleet, long_prompt, sim

SEED = 7


@pytest.fixture
async def coordinator() -> AsyncIterator[RunningCoordinator]:
    async with run_coordinator(fleet()) as running:
        yield running


def _async(running: RunningCoordinator) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{running.url}/v1", api_key="none", max_retries=0)


def _sync(running: RunningCoordinator) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{running.url}/v1", api_key="none", max_retries=0)


async def _single(
    client: openai.AsyncOpenAI, prompt: str | list[int], seed: int, max_tokens: int = 6
) -> str:
    done = await client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, seed=seed, n=1
    )
    return done.choices[0].text


async def test_completions_n_and_batches(coordinator: RunningCoordinator) -> None:
    client = _async(coordinator)
    single = long_prompt()
    prompts = [long_prompt(), long_prompt(), long_prompt()]

    # n = 2 on one prompt, not streamed: one prefill (route pd), two choices from decode, and
    # the decode engine pulls the prompt's KV once (as much as for an n = 1 prompt as long)
    decode_url = coordinator.coordinator.fleet.routable("decode")[0].url
    async with httpx.AsyncClient() as http:
        before = await engine_metric(http, decode_url, EXTERNAL)
        await _single(client, long_prompt(), SEED)
        pulled_once = await engine_metric(http, decode_url, EXTERNAL) - before
        raw = await client.completions.with_raw_response.create(
            model=MODEL, prompt=single, max_tokens=6, seed=SEED, n=2
        )
        pulled = await engine_metric(http, decode_url, EXTERNAL) - before - pulled_once
    assert raw.headers["x-pdorch-route"] == "pd"
    assert pulled == pulled_once > 0
    one = raw.parse()
    assert [c.index for c in one.choices] == [0, 1]
    assert [c.text for c in one.choices] == [
        await _single(client, single, SEED + j) for j in (0, 1)
    ]
    assert one.choices[0].text != one.choices[1].text
    assert one.usage is not None and one.usage.completion_tokens == 12

    # a batch of 3 prompts x n = 2, not streamed: prompt-major indices, usage summed
    raw_batch = await client.completions.with_raw_response.create(
        model=MODEL, prompt=prompts, max_tokens=6, seed=SEED, n=2
    )
    assert raw_batch.headers["x-pdorch-route"] == "pd,pd,pd"
    batch = raw_batch.parse()
    expected = {
        (i, j): await _single(client, p, SEED + j) for i, p in enumerate(prompts) for j in (0, 1)
    }
    assert [c.index for c in batch.choices] == list(range(6))
    assert [c.text for c in batch.choices] == [expected[i, j] for i in range(3) for j in (0, 1)]
    assert batch.usage is not None and batch.usage.completion_tokens == 36
    assert batch.usage.total_tokens == batch.usage.prompt_tokens + 36
    assert batch.usage.prompt_tokens == 3 * one.usage.prompt_tokens  # same-length prompts

    # the same batch streamed with include_usage: every index, the same texts, one usage chunk
    texts: dict[int, str] = {}
    usages = []
    ids = set()
    stream = await client.completions.create(
        model=MODEL,
        prompt=prompts,
        max_tokens=6,
        seed=SEED,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        ids.add(chunk.id)
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
        if chunk.usage is not None:
            assert not chunk.choices
            usages.append(chunk.usage)
    assert len(ids) == 1
    assert [texts[k] for k in range(6)] == [c.text for c in batch.choices]
    assert len(usages) == 1 and usages[0].completion_tokens == 36

    # token-id prompts, with the sync client (in a thread: it blocks)
    sync = _sync(coordinator)
    token_batch = [[5, 6, 7, 8] * 10, [9, 10, 11] * 12]
    done = await asyncio.to_thread(
        sync.completions.create, model=MODEL, prompt=token_batch, max_tokens=4, seed=SEED
    )
    assert [c.index for c in done.choices] == [0, 1]
    singles = [await _single(client, p, SEED, 4) for p in token_batch]
    assert [c.text for c in done.choices] == singles
    assert done.usage is not None and done.usage.prompt_tokens == 40 + 36

    def sync_stream() -> list[int]:
        seen: list[int] = []
        for chunk in sync.completions.create(
            model=MODEL, prompt=prompts[:2], max_tokens=3, n=3, stream=True
        ):
            seen.extend(c.index for c in chunk.choices)
        return seen

    assert set(await asyncio.to_thread(sync_stream)) == set(range(6))


async def test_echo_and_logprobs(coordinator: RunningCoordinator) -> None:
    client = _async(coordinator)
    prompt = long_prompt(40)
    done = await client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=5, echo=True, logprobs=2
    )
    choice = done.choices[0]
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
    lp = choice.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert done.usage is not None
    assert len(lp.tokens) == done.usage.prompt_tokens + 5  # echoed prompt tokens + output
    assert lp.token_logprobs[0] is None  # the first prompt token has none
    assert all(v is not None and v < 0 for v in lp.token_logprobs[1:])
    assert lp.top_logprobs is not None and all(1 <= len(t) <= 3 for t in lp.top_logprobs[1:])
    assert "".join(lp.tokens) == choice.text

    # streamed: the echo in the first chunk, logprobs per chunk, the same text
    text = ""
    tokens: list[str] = []
    async for chunk in await client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=5, echo=True, logprobs=2, stream=True
    ):
        for c in chunk.choices:
            text += c.text
            if c.logprobs is not None and c.logprobs.tokens:
                tokens.extend(c.logprobs.tokens)
    assert text == choice.text
    assert tokens == lp.tokens

    # chat: n = 2 with logprobs + top_logprobs, streamed and not
    messages: list[Any] = [{"role": "user", "content": long_prompt(40)}]
    chat = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, n=2, seed=SEED, logprobs=True, top_logprobs=2
    )
    assert [c.index for c in chat.choices] == [0, 1]
    for c in chat.choices:
        assert c.logprobs is not None and c.logprobs.content is not None
        assert len(c.logprobs.content) == 4
        assert all(len(t.top_logprobs) == 2 for t in c.logprobs.content)
        assert "".join(t.token for t in c.logprobs.content) == c.message.content
    streamed: dict[int, str] = {}
    usage = None
    async for chunk in await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=4,
        n=2,
        seed=SEED,
        logprobs=True,
        top_logprobs=1,
        stream=True,
        stream_options={"include_usage": True},
    ):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
        usage = chunk.usage or usage
    assert streamed == {c.index: c.message.content for c in chat.choices}
    assert usage is not None and usage.completion_tokens == 8


async def test_passthrough_routes_and_refusals(coordinator: RunningCoordinator) -> None:
    client = _async(coordinator)
    tokenized: Any = await client.post(
        "/../tokenize", body={"model": MODEL, "prompt": "hello"}, cast_to=httpx.Response
    )
    tokens = tokenized.json()["tokens"]
    assert tokens and tokenized.json()["count"] == len(tokens)
    detok: Any = await client.post(
        "/../detokenize", body={"model": MODEL, "tokens": tokens}, cast_to=httpx.Response
    )
    assert detok.json()["prompt"] == "hello"

    # no simulated engine serves these: OpenAI-shaped 404s naming the route
    with pytest.raises(openai.NotFoundError) as embed:
        await client.embeddings.create(model=MODEL, input="hello")
    assert embed.value.code == "route_not_served" and "/v1/embeddings" in embed.value.message
    with pytest.raises(openai.NotFoundError) as responses:
        await client.responses.create(model=MODEL, input="hello")
    assert responses.value.code == "route_not_served"
    with pytest.raises(openai.BadRequestError) as stored:
        await client.responses.create(model=MODEL, input="hi", previous_response_id="resp_1")
    assert stored.value.param == "previous_response_id"

    # refusals name the param
    with pytest.raises(openai.BadRequestError) as embeds:
        await client.completions.create(
            model=MODEL, prompt="x", extra_body={"prompt_embeds": "AAAA"}
        )
    assert embeds.value.param == "prompt_embeds"
    with pytest.raises(openai.BadRequestError) as too_many:
        await client.completions.create(model=MODEL, prompt=["a"] * 40, n=2)
    assert too_many.value.param == "n"
    with pytest.raises(openai.BadRequestError) as bad_item:
        await client.completions.create(model=MODEL, prompt=["a", ""])
    assert bad_item.value.param == "prompt[1]"
    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model="nope", prompt=["a", "b"])

    # sync client, /v1/models
    models = await asyncio.to_thread(_sync(coordinator).models.list)
    assert [m.id for m in models.data] == [MODEL]


def test_n_is_not_migratable_and_prefill_takes_one() -> None:
    from pools.pd_protocol import prefill_leg_body

    body = b'{"model": "m", "prompt": "p", "n": 3, "stream": true}'
    parsed = parse_request(body, "completion", "m")
    assert parsed.n == 3 and not_migratable(parsed) == "n"
    assert prefill_leg_body(parsed.body)["n"] == 1
    # completions' logprobs: a continuation's text_offsets would restart at 0
    with_logprobs = b'{"model": "m", "prompt": "p", "logprobs": 0, "stream": true}'
    assert not_migratable(parse_request(with_logprobs, "completion", "m")) == "logprobs"


def _pooling_engine() -> FastAPI:
    """A stand-in for an engine serving `/v1/embeddings` in vLLM's shape (vLLM: a pooling model)
    and `/v1/responses` (streamed: typed SSE events), `/health`, `/metrics`; no completions."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response("", media_type="text/plain")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = await request.json()
        vector = array("f", [0.5, -0.25, 0.125])
        value: Any = vector.tolist()
        if body.get("encoding_format") == "base64":
            value = base64.b64encode(vector.tobytes()).decode()
        answer = {
            "id": "embd-1",
            "object": "list",
            "created": 0,
            "model": body["model"],
            "data": [{"index": 0, "object": "embedding", "embedding": value}],
            "usage": {"prompt_tokens": 2, "total_tokens": 2},
        }
        return Response(json.dumps(answer), media_type="application/json")

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        body = await request.json()
        if body.get("stream"):
            return StreamingResponse(_response_events(), media_type="text/event-stream")
        return Response(json.dumps({"id": "resp_1", "object": "response"}))

    return app


RESPONSE_EVENTS = [
    b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n',
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta"}\n\n',
    b'event: response.completed\ndata: {"type":"response.completed","sequence_number":2}\n\n',
]


async def _response_events() -> AsyncIterator[bytes]:
    for event in RESPONSE_EVENTS:
        yield event


async def test_embeddings_and_responses_go_to_the_replica_that_serves_them() -> None:
    server = InLoopHttpServer(_pooling_engine())
    url = await server.start()
    try:
        config = fleet(prefill=[sim()])
        data = config.model_dump()
        data["pools"]["prefill"]["endpoints"] = [{"url": url, "id": "embedder"}]
        async with run_coordinator(parse_fleet_config(data)) as running:
            client = _async(running)
            for _ in range(3):  # the sims answer a plain 404 once, then are skipped
                raw = await client.embeddings.with_raw_response.create(model=MODEL, input="hi")
                assert raw.headers["x-pdorch-replica"] == "embedder"
                assert raw.parse().data[0].embedding == [0.5, -0.25, 0.125]
            floats = await asyncio.to_thread(
                _sync(running).embeddings.create, model=MODEL, input="hi", encoding_format="float"
            )
            assert floats.data[0].embedding == [0.5, -0.25, 0.125]
            # a streamed /v1/responses is relayed byte for byte
            async with (
                httpx.AsyncClient(base_url=running.url) as http,
                http.stream(
                    "POST", "/v1/responses", json={"model": MODEL, "input": "hi", "stream": True}
                ) as streamed,
            ):
                assert streamed.status_code == 200
                assert streamed.headers["content-type"].startswith("text/event-stream")
                assert b"".join([c async for c in streamed.aiter_raw()]) == b"".join(
                    RESPONSE_EVENTS
                )
    finally:
        await server.stop()
