"""Fixtures for the coordinator tests: a sim fleet + coordinator on loopback, per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from pdorch.app.server import RunningCoordinator, run_coordinator
from tests.coordinator.helpers import fleet


@pytest.fixture
async def pd() -> AsyncIterator[RunningCoordinator]:
    """1 prefill + 1 decode simulated engine (in process) behind a coordinator."""
    async with run_coordinator(fleet()) as running:
        yield running


@pytest.fixture
async def client(pd: RunningCoordinator) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=pd.url, timeout=30.0) as c:
        yield c
