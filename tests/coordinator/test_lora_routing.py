"""LoRA adapters behind the coordinator: only replicas with the adapter loaded serve it, its
block keys are salted by it, `/v1/models` lists it with its parent, unknown models get 404."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from pdorch.app.server import RunningCoordinator, run_coordinator
from pools.http_client import http_client
from router.token_load import TokenLoadDelta
from tests.coordinator.helpers import MODEL, fleet, long_prompt, sim
from tests.waiting import async_wait_until

ADAPTER = "sql-lora"


async def until(condition: Callable[[], bool], deadline_s: float = 10.0) -> None:
    """Poll a plain condition on the running loop (the fleet's loops keep running)."""

    async def check() -> bool:
        return condition()

    await async_wait_until(check, timeout=deadline_s)


@pytest.fixture
async def lora_fleet() -> AsyncIterator[RunningCoordinator]:
    """prefill-0 (no adapter); decode-0 with `sql-lora`, decode-1 without."""
    config = fleet(
        prefill=[sim(1)],
        decode=[sim(1, lora_modules=[f"{ADAPTER}=/adapters/sql"]), sim(1)],
    )
    async with run_coordinator(config) as running:
        c = running.coordinator
        await until(lambda: c.adapters.holders(ADAPTER) == {"decode-0"})
        yield running


async def test_adapter_requests_go_only_to_replicas_with_it(
    lora_fleet: RunningCoordinator,
) -> None:
    async with http_client(base_url=lora_fleet.url, timeout=30.0) as client:
        for _ in range(4):
            answer = await client.post(
                "/v1/completions",
                json={"model": ADAPTER, "prompt": long_prompt(), "max_tokens": 2},
            )
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-pdorch-decode"] == "decode-0"
            # the prefill replica lacks the adapter: decode-0 prefills it itself
            assert answer.headers["x-pdorch-prefill"] == "decode-0"
            assert answer.json()["model"] == ADAPTER
        # /admin/explain routes as the request path does: decode-1 is no candidate
        explained = await client.post(
            "/admin/explain", json={"model": ADAPTER, "prompt": long_prompt()}
        )
        assert explained.status_code == 200, explained.text
        rows = {r["replica_id"]: r for r in explained.json()["decision"]["decode"]["replicas"]}
        assert rows["decode-0"]["chosen"] and not rows["decode-1"]["healthy"]
        # decode-0 busy (a peer's load): the base model moves to decode-1, the adapter stays
        c = lora_fleet.coordinator
        busy = TokenLoadDelta(
            origin="peer", version=1, request_id="peer", replica_id="decode-0", decode_blocks=5000
        )
        c.apply_token_load_deltas([busy])
        for model, expected in ((MODEL, "decode-1"), (ADAPTER, "decode-0")):
            answer = await client.post(
                "/v1/completions",
                json={"model": model, "prompt": long_prompt(), "max_tokens": 2, "stream": True},
            )
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-pdorch-decode"] == expected


async def test_models_lists_adapters_with_parent_and_unknown_is_404(
    lora_fleet: RunningCoordinator,
) -> None:
    async with http_client(base_url=lora_fleet.url, timeout=30.0) as client:
        models = (await client.get("/v1/models")).json()["data"]
        cards = {m["id"]: m for m in models}
        assert set(cards) == {MODEL, ADAPTER}
        assert cards[MODEL]["parent"] is None
        assert cards[ADAPTER]["parent"] == MODEL
        assert cards[ADAPTER]["root"] == "/adapters/sql"
        missing = await client.post(
            "/v1/completions", json={"model": "nope", "prompt": "hi", "max_tokens": 1}
        )
        assert missing.status_code == 404
        error = missing.json()["error"]
        assert error["code"] == "model_not_found"
        assert f"`{MODEL}`" in error["message"] and f"`{ADAPTER}`" in error["message"]


async def test_adapter_blocks_are_indexed_under_salted_keys(
    lora_fleet: RunningCoordinator,
) -> None:
    c = lora_fleet.coordinator
    decode_0 = c.fleet.get("decode-0")
    assert decode_0 is not None
    prompt = long_prompt(words=200)
    async with http_client(base_url=lora_fleet.url, timeout=30.0) as client:
        answer = await client.post(
            "/v1/completions", json={"model": ADAPTER, "prompt": prompt, "max_tokens": 1}
        )
        assert answer.status_code == 200, answer.text
        tokenized = await client.post(
            f"{decode_0.url}/tokenize", json={"model": MODEL, "prompt": prompt}
        )
    tokens = tokenized.json()["tokens"]
    salted = c.index.keys_for(tokens, lora_name=ADAPTER)
    plain = c.index.keys_for(tokens)
    assert len(salted) >= 4 and set(salted).isdisjoint(plain)
    # the engine's BlockStored (lora_name = the adapter) re-keyed by the index = our salted keys
    await until(lambda: c.index.match(salted).get("decode-0", 0) == len(salted))
    assert "decode-0" not in c.index.match(plain)


async def test_adapter_on_both_pools_is_disaggregated() -> None:
    adapter = [f"{ADAPTER}=/adapters/sql"]
    config = fleet(
        prefill=[sim(1), sim(1, lora_modules=adapter)], decode=[sim(1, lora_modules=adapter)]
    )
    async with run_coordinator(config) as running:
        c = running.coordinator
        await until(lambda: c.adapters.holders(ADAPTER) == {"prefill-1", "decode-0"})
        async with http_client(base_url=running.url, timeout=30.0) as client:
            answer = await client.post(
                "/v1/completions",
                json={"model": ADAPTER, "prompt": long_prompt(), "max_tokens": 3},
            )
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-pdorch-route"] == "pd"
        assert answer.headers["x-pdorch-prefill"] == "prefill-1"
        assert answer.headers["x-pdorch-decode"] == "decode-0"
