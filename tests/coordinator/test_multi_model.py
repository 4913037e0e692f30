"""Several models behind one endpoint (`models:` in the fleet file): requests route by `model`
to that model's own pools, `/v1/models` lists every model and adapter, unknown names get 404."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from pdorch.app.server import RunningCoordinator, run_coordinator
from pdorch.config.fleet import parse_fleet_config
from pools.http_client import http_client
from tests.coordinator.helpers import long_prompt, sim
from tests.waiting import async_wait_until

CHAT = "chat-8b"
CODE = "code-3b"
ADAPTER = "code-sql"


async def until(condition: Callable[[], bool], deadline_s: float = 10.0) -> None:
    async def check() -> bool:
        return condition()

    await async_wait_until(check, timeout=deadline_s)


@pytest.fixture
async def two_models() -> AsyncIterator[RunningCoordinator]:
    """chat-8b: 1 prefill + 1 decode (block 16); code-3b: 2 colocated (block 32), one of them
    with the LoRA adapter code-sql."""
    config = parse_fleet_config(
        {
            "models": [
                {
                    "served_model_name": CHAT,
                    "pools": {"prefill": {"launch": [sim()]}, "decode": {"launch": [sim()]}},
                    "pd": {"min_uncached_tokens": 32},
                },
                {
                    "served_model_name": CODE,
                    "block_size": 32,
                    "pools": {
                        "decode": {},
                        "colocated": {
                            "policy": {"name": "round_robin"},
                            "launch": [sim(1, lora_modules=[ADAPTER]), sim(1)],
                        },
                    },
                },
            ],
            "coordinator": {"port": 0},
            "health": {"timeout_s": 2.0},
        }
    )
    async with run_coordinator(config) as running:
        code = running.models[CODE][0]
        await until(lambda: code.adapters.holders(ADAPTER) == {"colocated-0"})
        yield running


async def test_requests_route_by_model_to_its_own_pools(two_models: RunningCoordinator) -> None:
    chat, _ = two_models.models[CHAT]
    code, _ = two_models.models[CODE]
    assert two_models.coordinator is chat  # the first model is the primary
    assert code.block_size == 32 and chat.block_size == 16
    code_urls = {r.url for r in code.fleet.replicas()}
    async with http_client(base_url=two_models.url, timeout=30.0) as client:
        for stream in (False, True):
            answer = await client.post(
                "/v1/completions",
                json={"model": CHAT, "prompt": long_prompt(), "max_tokens": 2, "stream": stream},
            )
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-pdorch-route"] == "pd"
            assert (answer.headers["x-pdorch-prefill"], answer.headers["x-pdorch-decode"]) == (
                "prefill-0",
                "decode-0",
            )
            answer = await client.post(
                "/v1/chat/completions",
                json={
                    "model": CODE,
                    "messages": [{"role": "user", "content": long_prompt()}],
                    "max_tokens": 2,
                    "stream": stream,
                },
            )
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-pdorch-route"] == "colocated"
        # the adapter is code-3b's, on colocated-0 only
        for _ in range(3):
            answer = await client.post(
                "/v1/completions",
                json={"model": ADAPTER, "prompt": long_prompt(), "max_tokens": 2},
            )
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-pdorch-decode"] == "colocated-0"
            assert answer.json()["model"] == ADAPTER
    # each model's requests reached only its own engines
    assert chat.metrics is not code.metrics
    assert all(r.url not in code_urls for r in chat.fleet.replicas())


async def test_models_lists_every_model_and_unknown_names_them(
    two_models: RunningCoordinator,
) -> None:
    async with http_client(base_url=two_models.url, timeout=30.0) as client:
        cards = (await client.get("/v1/models")).json()["data"]
        assert [(m["id"], m["parent"]) for m in cards] == [
            (CHAT, None),
            (CODE, None),
            (ADAPTER, CODE),
        ]
        for path, body in (
            ("/v1/completions", {"model": "llama-70b", "prompt": "hi", "max_tokens": 1}),
            ("/v1/chat/completions", {"model": "llama-70b", "messages": []}),
        ):
            missing = await client.post(path, json=body)
            assert missing.status_code == 404, missing.text
            error = missing.json()["error"]
            assert error["code"] == "model_not_found"
            for name in (CHAT, CODE, ADAPTER):
                assert f"`{name}`" in error["message"]
        # a body that is no JSON object still gets the precise 400
        broken = await client.post(
            "/v1/completions", content=b"[1, 2]", headers={"content-type": "application/json"}
        )
        assert broken.status_code == 400
        assert broken.json()["error"]["code"] == "invalid_json"
        assert (await client.get("/health")).status_code == 200
