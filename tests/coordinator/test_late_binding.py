"""Late binding in the coordinator (pdorch/app/binding.py, router/late_binding.py) against real
simulated engine processes: a request that arrives while the only prefill replica is busy is
held at the coordinator (not sent), and sent once that replica's prefill leg returns; off by
default."""

from __future__ import annotations

import asyncio
from typing import Any

from pdorch.app.server import run_coordinator
from pools.http_client import http_client
from tests.coordinator.helpers import MODEL, fleet, long_prompt, sim
from tests.waiting import async_wait_until


def test_late_binding_is_off_by_default() -> None:
    config = fleet()
    assert not config.late_binding.enabled
    assert not config.router_policy_config().late_binding.enabled


async def test_a_request_waits_at_the_coordinator_while_the_prefill_replica_is_busy() -> None:
    # any queued prefill token makes the replica busy; the prefill engine runs in real time
    # so the first prompt's prefill leg lasts long enough to be seen
    late: dict[str, Any] = {"enabled": True, "hold_queued_s": 1e-9}
    config = fleet(prefill=[sim(time_scale=20.0)], late_binding=late)
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2}
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=60.0) as client,
    ):
        c = pd.coordinator
        binder = c.binder
        assert binder.queue is not None
        first = asyncio.ensure_future(
            client.post("/v1/completions", json={**body, "prompt": long_prompt(500)})
        )

        async def prefilling() -> bool:
            return c.token_load.load("prefill-0", c.now()).prefill_tokens_queued > 0

        await async_wait_until(prefilling, timeout=20.0, message="the first prefill leg runs")
        second = asyncio.ensure_future(
            client.post("/v1/completions", json={**body, "prompt": long_prompt(100)})
        )

        async def held() -> bool:
            return binder.held == 1

        await async_wait_until(held, timeout=10.0, message="the second request held")
        # held: not admitted to the lifecycle, so no replica counts it
        assert c.token_load.tracked_requests() == 2  # the first's prefill and decode entries
        answers = await asyncio.gather(first, second)
        for answer in answers:
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-pdorch-route"] == "pd"
        assert binder.held == 0 and binder.queue.admitted == 2
        assert c.token_load.tracked_requests() == 0 and c.in_flight == 0
