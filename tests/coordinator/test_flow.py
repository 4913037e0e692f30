"""The P/D flow through the coordinator, against simulated engines over real HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from pdorch.app.server import RunningCoordinator, run_coordinator
from pools.http_client import http_client
from tests.coordinator.helpers import (
    EXTERNAL,
    LEG_CLIENTS,
    MODEL,
    answer_text,
    engine_metric,
    fleet,
    long_prompt,
    sim,
    sse_events,
    stream_text,
)
from transfer.params import KvTransferParams


@pytest.fixture(params=LEG_CLIENTS)
async def pd(request: pytest.FixtureRequest) -> AsyncIterator[RunningCoordinator]:
    """conftest's `pd` on each leg client (`coordinator.leg_client`)."""
    async with run_coordinator(fleet(coordinator={"leg_client": request.param})) as running:
        yield running


def _body(chat: bool, stream: bool, prompt: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 12, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_pd_output_equals_colocated_and_decode_pulls_kv(
    pd: RunningCoordinator, client: httpx.AsyncClient, chat: bool, stream: bool
) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    decode_url = pd.coordinator.fleet.replicas("decode")[0].url
    before = await engine_metric(client, decode_url, EXTERNAL)
    body = _body(chat, stream, long_prompt())

    response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    assert response.headers["x-pdorch-route"] == "pd"
    assert response.headers["x-pdorch-prefill"] == "prefill-0"
    assert response.headers["x-pdorch-decode"] == "decode-0"
    rid = response.headers["x-request-id"]
    assert rid.startswith("pdorch-")
    # the decode engine pulled the prompt's KV instead of recomputing it
    after = await engine_metric(client, decode_url, EXTERNAL)
    assert after > before

    # the same request straight to one engine (colocated: it prefills and decodes)
    direct = await client.post(f"{decode_url}{path}", json=body)
    assert direct.status_code == 200
    if stream:
        events = sse_events(response.text)
        assert events[-1] == "[DONE]"
        assert all(e["id"].endswith(rid) for e in events if isinstance(e, dict))
        assert stream_text(events, chat) == stream_text(sse_events(direct.text), chat)
        assert response.headers["content-type"].startswith("text/event-stream")
    else:
        got = response.json()
        assert got["id"].endswith(rid)  # the decode engine saw our X-Request-Id
        assert answer_text(got, chat) == answer_text(direct.json(), chat)
        assert got["usage"]["completion_tokens"] == 12
    # everything released
    view = (await client.get("/admin/pools")).json()
    assert view["requests_in_flight"] == 0 and view["tracked_requests"] == 0


async def test_short_prompt_prefills_on_decode(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3}
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-pdorch-route"] == "local"
    assert response.headers["x-pdorch-prefill"] == response.headers["x-pdorch-decode"]


async def test_client_kv_transfer_params_are_dropped(client: httpx.AsyncClient) -> None:
    # forwarded, these would make the decode engine pull from a peer that does not exist
    bogus = KvTransferParams(
        do_remote_prefill=True,
        remote_engine_id="nope",
        remote_block_ids=[[1, 2, 3]],
        remote_host="127.0.0.1",
        remote_port=9,
    ).wire()
    for prompt in ("hi", long_prompt()):
        response = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": prompt, "max_tokens": 3, "kv_transfer_params": bogus},
        )
        assert response.status_code == 200, response.text


async def test_token_ids_prompt_models_health_metrics(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": list(range(1, 100)), "max_tokens": 2}
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-pdorch-route"] == "pd"
    models = (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert (await client.get("/health")).status_code == 200
    metrics = (await client.get("/metrics")).text
    assert 'pdorch_requests_total{endpoint="completions",status="200"} 1.0' in metrics
    assert 'pdorch_routes_total{route="pd"} 1.0' in metrics
    assert 'pdorch_replica_healthy{pool="decode",replica="decode-0"} 1.0' in metrics


async def test_colocated_only_fleet() -> None:
    config = fleet(prefill=[], decode=[], pools={"colocated": {"launch": [sim()]}})
    async with (
        run_coordinator(config) as running,
        http_client(base_url=running.url, timeout=30.0) as client,
    ):
        for stream in (False, True):
            response = await client.post(
                "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": long_prompt()}],
                    "max_tokens": 4,
                    "stream": stream,
                },
            )
            assert response.status_code == 200, response.text
            assert response.headers["x-pdorch-route"] == "colocated"
            assert response.headers["x-pdorch-decode"] == "colocated-0"
            assert response.headers["x-pdorch-prefill"] == "colocated-0"
