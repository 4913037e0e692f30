"""Issue 14 (readiness): a restarted coordinator's join replay is measured, in `/metrics`.

Real parts as in `test_readiness.py` (whose relay and fleet copy this reuses): coordinator A
fills a simulated engine's prefix cache; coordinator B over the same engines has that
engine's replay held by a relay the test releases. Once B is ready its `/metrics` says how
long the replay took (at least as long as the test held it), that it completed as a join
replay, the blocks it stored (the engine's cache), and the duration histogram counts it.
"""

from __future__ import annotations

import re
import time

from pdorch.app.server import run_coordinator
from pools.http_client import http_client
from tests.coordinator.helpers import fleet
from tests.coordinator.test_readiness import health, held_join
from tests.waiting import async_wait_until


def _sample(metrics: str, name: str, labels: str) -> float | None:
    found = re.search(rf"^{name}\{{{labels}\}} (\S+)$", metrics, re.M)
    return float(found.group(1)) if found else None


async def test_the_join_replay_duration_and_blocks_are_in_metrics() -> None:
    async with run_coordinator(fleet(), port=0) as a, http_client(timeout=30.0) as http:
        async with held_join(http, a) as join:
            b, held, cached = join.b, join.held, join.cached
            rid = join.decode.replica_id

            async def asked() -> bool:
                return held.asked > 0

            await async_wait_until(asked, 10.0, message="B asked for the replay")
            seen_at = time.monotonic()

            async def replaying() -> bool:
                return await health(http, b.url) == (503, "replaying")

            await async_wait_until(replaying, 10.0, message="503 replaying")
            held_s = time.monotonic() - seen_at
            metrics = (await http.get(f"{b.url}/metrics")).text
            # held: not ended, so no record of it yet (the prefill engine's may be there)
            assert _sample(metrics, "pdorch_kv_replay_last_blocks", f'replica="{rid}"') is None
            held.release.set()

            async def ready() -> bool:
                return await health(http, b.url) == (200, None)

            await async_wait_until(ready, 10.0, message="ready")
            metrics = (await http.get(f"{b.url}/metrics")).text
        labels = f'join="true",outcome="completed",replica="{rid}"'
        seconds = _sample(metrics, "pdorch_kv_replay_last_seconds", labels)
        assert seconds is not None, metrics
        assert seconds >= held_s  # measured from the request, through the hold, to the end
        blocks = _sample(metrics, "pdorch_kv_replay_last_blocks", f'replica="{rid}"')
        assert blocks == cached
        count = _sample(metrics, "pdorch_kv_replay_duration_seconds_count", 'outcome="completed"')
        assert count is not None and count >= 1
