"""`POST /admin/replicas/{id}/drain` (what the Kubernetes actuator and a pod's preStop call):
out of routing, in-flight requests finish or are cut at the timeout, cancel brings it back."""

from __future__ import annotations

import asyncio

from pdorch.app.server import RunningCoordinator, run_coordinator
from pools.http_client import http_client
from pools.replica import ReplicaState
from tests.coordinator.helpers import MODEL, assert_openai_error, fleet, sim
from tests.waiting import async_wait_until

ADMIN = {"Authorization": "Bearer root"}


def state(pd: RunningCoordinator, replica_id: str) -> ReplicaState | None:
    replica = pd.coordinator.fleet.get(replica_id)
    return replica.state if replica is not None else None


async def test_drain_waits_for_in_flight_work_cuts_at_the_timeout_and_cancels() -> None:
    config = fleet(decode=[sim(2, time_scale=1.0)], coordinator={"admin_token": "root"})
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=60.0) as client,
    ):
        assert_openai_error(await client.post("/admin/replicas/decode-0/drain"), 401)
        assert_openai_error(
            await client.post("/admin/replicas/nope/drain", headers=ADMIN, json={}), 404
        )
        assert_openai_error(
            await client.post("/admin/replicas/decode-0/drain", headers=ADMIN, json={"x": 1}), 400
        )
        # an idle replica drains at once and stays out of routing
        done = await client.post("/admin/replicas/decode-0/drain", headers=ADMIN, json={})
        assert done.status_code == 200, done.text
        assert done.json()["timed_out"] is False and done.json()["pool"] == "decode"
        assert state(pd, "decode-0") is ReplicaState.DRAINING
        cancelled = await client.post(
            "/admin/replicas/decode-0/drain", headers=ADMIN, json={"cancel": True}
        )
        assert cancelled.json() == {"replica": "decode-0", "pool": "decode", "cancelled": True}
        assert state(pd, "decode-0") is ReplicaState.HEALTHY

        # a long stream on decode-1 past a short timeout: cut with an error event, not dropped
        await client.post("/admin/replicas/decode-0/drain", headers=ADMIN, json={})
        body = {"model": MODEL, "prompt": "go", "max_tokens": 4000, "stream": True}
        chunks: list[str] = []

        async def stream() -> None:
            async with client.stream("POST", "/v1/completions", json=body) as answer:
                async for line in answer.aiter_lines():
                    chunks.append(line)

        task = asyncio.create_task(stream())

        async def streaming() -> bool:
            return any(c.startswith("data: {") for c in chunks)

        await async_wait_until(streaming, timeout=30.0, message="first stream chunk")
        assert pd.coordinator.requests.in_flight("decode-1") == 1
        cut = await client.post(
            "/admin/replicas/decode-1/drain", headers=ADMIN, json={"timeout_s": 0.3}
        )
        assert cut.json()["timed_out"] is True and cut.json()["cut"] == 1, cut.text
        await asyncio.wait_for(task, 30)
        events = [c for c in chunks if c.startswith("data: ")]
        assert '"error"' in events[-2] and "drained" in events[-2], events[-2:]
        assert events[-1] == "data: [DONE]"
