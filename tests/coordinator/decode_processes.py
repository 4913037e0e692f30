"""A fleet whose decode engines are real processes a test can signal (`kill -9`, SIGSTOP), and
the checks such tests share: the engine's pid, a labelled counter from `/metrics`, and "the
token load is back to exactly 0" (issue 14's migration and first-byte tests)."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import httpx

from pdorch.app.server import RunningCoordinator, run_coordinator
from pools.http_client import http_client
from tests.coordinator.helpers import fleet, sim
from tests.waiting import async_wait_until


@asynccontextmanager
async def decode_process_fleet(
    *, client_timeout_s: float = 60.0, **sections: Any
) -> AsyncIterator[tuple[RunningCoordinator, httpx.AsyncClient]]:
    """1 prefill engine in process + 2 decode engine processes (real time) behind a coordinator;
    `sections` are fleet-file sections (`coordinator`, `health`, `tokenizer`, ...) merged over
    `helpers.fleet`'s. Every engine is sent SIGCONT on the way out: a stopped engine must be
    able to take the SIGKILL that ends it."""
    coordinator = {"port": 0, **sections.pop("coordinator", {})}
    config = fleet(
        decode=[sim(2, in_process=False, time_scale=1.0)], coordinator=coordinator, **sections
    )
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=client_timeout_s) as client,
    ):
        try:
            yield pd, client
        finally:
            for pid in pd.fleet.pids():
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


def engine_pid(pd: RunningCoordinator, replica_id: str) -> int:
    """The pid of decode replica `decode-<n>` (the only engines run as processes here)."""
    return pd.fleet.pids()[int(replica_id.rsplit("-", 1)[1])]


async def labelled_counter(client: httpx.AsyncClient, name: str) -> dict[str, float]:
    """A one-label counter of the coordinator's `/metrics`, by label value."""
    text = (await client.get("/metrics")).text
    found = re.findall(rf'^{name}\{{[a-z]+="([a-z_:]+)"\}} (\S+)$', text, re.MULTILINE)
    return {label: float(value) for label, value in found}


async def assert_settled(pd: RunningCoordinator, client: httpx.AsyncClient) -> None:
    """No request tracked or in flight, and every replica's token load exactly 0."""

    async def idle() -> bool:
        view = (await client.get("/admin/pools")).json()
        return bool(view["tracked_requests"] == 0 and view["requests_in_flight"] == 0)

    await async_wait_until(idle, timeout=10.0, message="token load back to 0")
    now = pd.coordinator.clock()
    for replica in pd.coordinator.fleet.replicas():
        load = pd.coordinator.token_load.load(replica.replica_id, now)
        assert (load.prefill_tokens_queued, load.decode_blocks, load.requests_in_flight) == (
            0,
            0,
            0,
        ), replica.replica_id
