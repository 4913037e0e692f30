"""Fixtures for the coordinator tests: a sim fleet + coordinator on loopback, per test; a real
Prometheus server (`prometheus`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdorch.app.server import RunningCoordinator, run_coordinator
from pools.http_client import http_client
from tests.coordinator.helpers import fleet
from tests.prometheus_server import PrometheusServer


@pytest.fixture
async def pd() -> AsyncIterator[RunningCoordinator]:
    """1 prefill + 1 decode simulated engine (in process) behind a coordinator."""
    async with run_coordinator(fleet()) as running:
        yield running


@pytest.fixture
async def client(pd: RunningCoordinator) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(base_url=pd.url, timeout=30.0) as c:
        yield c


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], PrometheusServer]]:
    """`start(config)` → a running real Prometheus (its workdir holds the config, the TSDB and
    the log; file_sd paths in the config are relative to it); every one started is stopped
    when the test ends, failed or not."""
    started: list[PrometheusServer] = []

    def start(config: dict[str, Any]) -> PrometheusServer:
        workdir = tmp_path / f"prometheus-{len(started)}"
        workdir.mkdir()
        server = PrometheusServer(config, workdir)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()
