"""The proxy bench's vllm-router start survives losing its port to another process.

vllm-router binds the port it is told, so a port picked free can be taken before it binds
(proxy-lean-5's A/B lost a run to it). Real parts: two simulated engines and the real
`vllm-router` (the `bench` extra). The first start is handed a port another socket already
listens on, as a lost race leaves it: the start must retry on fresh ports and return a serving
router. A failure of any other kind (here: engines that are not there) is not retried.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from benchmarks.proxy import processes
from benchmarks.proxy.processes import (
    ProcessStartError,
    RunningProcess,
    start_sim,
    start_vllm_router,
    stop_process,
)
from pools.ports import free_port, free_ports

pytestmark = pytest.mark.integration


@pytest.fixture
async def engines(tmp_path: Path) -> AsyncIterator[tuple[RunningProcess, RunningProcess]]:
    started: list[RunningProcess] = []
    try:
        for role in ("prefill", "decode"):
            started.append(
                await start_sim(
                    role,
                    tmp_path,
                    time_scale=0.0001,
                    model_profile="tiny",
                    served_model_name="bench-model",
                    kv_events_port=free_port(),
                )
            )
        yield started[0], started[1]
    finally:
        for proc in started:
            stop_process(proc)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process's socket listens on (what a lost race leaves)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


async def test_a_start_that_lost_its_port_is_retried_on_a_fresh_one(
    tmp_path: Path,
    engines: tuple[RunningProcess, RunningProcess],
    taken_port: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    picks: list[tuple[int, ...]] = []

    def pick(n: int) -> list[int]:  # the first pick loses the race; later ones are free
        ports = [taken_port, *free_ports(n - 1)] if not picks else free_ports(n)
        picks.append(tuple(ports))
        return ports

    monkeypatch.setattr(processes, "free_ports", pick)
    prefill, decode = engines
    proc = await start_vllm_router(prefill.url, decode.url, tmp_path, 60.0)
    try:
        assert proc.process.poll() is None  # the second start serves
        assert len(picks) == 2
        assert proc.url.endswith(f":{picks[1][0]}")
        assert processes.lost_its_port(tmp_path / "vllm-router.log")
    finally:
        stop_process(proc)


async def test_any_other_start_failure_is_raised_at_once(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # no engine there: the router never becomes ready
    with pytest.raises(ProcessStartError) as raised:
        await start_vllm_router(dead, dead, tmp_path, 15.0)
    assert not raised.value.port_taken
    assert not (tmp_path / "vllm-router-2.log").exists()  # one start only
