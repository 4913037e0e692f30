"""Routing through the coordinator: cached prefixes attract, token load repels."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from pdorch.app.server import RunningCoordinator, run_coordinator
from pools.http_client import http_client
from router.token_load import TokenLoadDelta
from tests.coordinator.helpers import MODEL, fleet, long_prompt, sim
from tests.waiting import async_wait_until


@pytest.fixture
async def two_prefill() -> AsyncIterator[RunningCoordinator]:
    async with run_coordinator(fleet(prefill=[sim(2)], decode=[sim(1)])) as running:
        yield running


def _peer_load(replica: str, tokens: int, version: int, removed: bool = False) -> TokenLoadDelta:
    """Load another coordinator reports on `replica` (the several-coordinators hook)."""
    return TokenLoadDelta(
        origin="peer",
        version=version,
        request_id="peer-request",
        replica_id=replica,
        removed=removed,
        prefill_tokens=tokens,
    )


async def _explain(client: httpx.AsyncClient, prompt: str) -> dict[str, Any]:
    response = await client.post("/admin/explain", json={"model": MODEL, "prompt": prompt})
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_repeated_prefix_goes_to_its_holder_and_load_is_avoided(
    two_prefill: RunningCoordinator,
) -> None:
    c = two_prefill.coordinator
    prefix = long_prompt(words=300)
    async with http_client(base_url=two_prefill.url, timeout=30.0) as client:
        # 1. prefill-0 busy (a peer's load) → the first request lands on prefill-1
        c.apply_token_load_deltas([_peer_load("prefill-0", 50_000, 1)])
        first = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": prefix, "max_tokens": 2}
        )
        assert first.status_code == 200, first.text
        assert first.headers["x-pdorch-prefill"] == "prefill-1"
        c.apply_token_load_deltas([_peer_load("prefill-0", 0, 2, removed=True)])

        # 2. once prefill-1's KV events are indexed, the prefix goes back there although
        #    prefill-0 (idle, lower id) would win a tie
        repeat = prefix + " and then " + " ".join(f"more{i}" for i in range(40))

        prefill_1 = c.fleet.get("prefill-1")
        assert prefill_1 is not None

        async def indexed() -> bool:
            decision = (await _explain(client, repeat))["decision"]
            rows = {r["replica_id"]: r for r in decision["prefill"]["replicas"]}
            if rows["prefill-1"]["overlap_blocks"] > 0:
                return True
            # A batch an engine publishes before our SUB socket has joined is lost (ZMQ); the
            # engine's next batch shows the sequence gap and the subscriber replays. On a
            # loaded box that can hit the first request, so give the engine a next batch.
            await client.post(
                f"{prefill_1.url}/v1/completions",
                json={"model": MODEL, "prompt": long_prompt(words=10), "max_tokens": 1},
            )
            return False

        await async_wait_until(
            indexed,
            timeout=10.0,
            interval=0.1,
            message=f"prefill-1's blocks indexed ({c.subscriber.metrics()})",
        )
        explained = await _explain(client, repeat)
        assert explained["route"]["prefill_replica"] == "prefill-1"
        second = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": repeat, "max_tokens": 2}
        )
        assert second.headers["x-pdorch-route"] == "pd"
        assert second.headers["x-pdorch-prefill"] == "prefill-1"

        # 3. the holder is loaded far beyond the prefix's worth → the idle replica wins
        c.apply_token_load_deltas([_peer_load("prefill-1", 1_000_000, 3)])
        third_prompt = prefix + " finally " + " ".join(f"last{i}" for i in range(40))
        explained = await _explain(client, third_prompt)
        rows = {r["replica_id"]: r for r in explained["decision"]["prefill"]["replicas"]}
        assert rows["prefill-1"]["overlap_blocks"] > 0
        assert rows["prefill-1"]["prefill_tokens_left"] >= 1_000_000
        third = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": third_prompt, "max_tokens": 2}
        )
        assert third.status_code == 200
        assert third.headers["x-pdorch-prefill"] == "prefill-0"


async def test_engines_without_kv_events_use_the_approximate_index() -> None:
    config = fleet(prefill=[sim(2, kv_events=False)], decode=[sim(1, kv_events=False)])
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        c = pd.coordinator
        assert all(r.endpoint.kv_events_endpoint is None for r in c.fleet.replicas())
        prefix = long_prompt(words=300)
        c.apply_token_load_deltas([_peer_load("prefill-0", 50_000, 1)])
        first = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": prefix, "max_tokens": 2}
        )
        assert first.headers["x-pdorch-prefill"] == "prefill-1"
        c.apply_token_load_deltas([_peer_load("prefill-0", 0, 2, removed=True)])
        # what we sent where is remembered: the prefix goes back to prefill-1 at once
        repeat = prefix + " and then " + " ".join(f"more{i}" for i in range(40))
        second = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": repeat, "max_tokens": 2}
        )
        assert second.headers["x-pdorch-route"] == "pd"
        assert second.headers["x-pdorch-prefill"] == "prefill-1"
        view = (await client.get("/admin/pools")).json()
        rows = {r["id"]: r for r in view["pools"]["prefill"]["replicas"]}
        assert rows["prefill-1"]["indexed_blocks"] > 0 and rows["prefill-0"]["indexed_blocks"] == 0
