"""pdorch's vLLM plugin: NIXL agents with a progress delay idle without spinning, and still move.

The integration test runs two real NIXL agents, configured as vLLM's NixlConnector configures
them, in two processes over UCX/TCP on loopback: the owner only idles, so the READ is served
by its progress thread alone (the case a too-long sleep would break).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import tomllib
from importlib import import_module
from pathlib import Path
from typing import Any

import psutil
import pytest

from transfer import nixl_progress

REPO = Path(__file__).resolve().parents[2]
PEER = [sys.executable, "-m", "tests.transfer.nixl_progress_peer"]
DELAY_US = 10_000
# An idle agent with the delay used 0.4 % of a core here, a spinning one 47-89 %.
IDLE_CPU_MAX = 0.10
IDLE_WINDOW_S = 3.0


@pytest.mark.unit
@pytest.mark.parametrize("raw", ["0", "-5", "1.5", "ten", ""])
def test_delay_must_be_a_positive_integer(raw: str) -> None:
    with pytest.raises(ValueError, match=nixl_progress.ENV):
        nixl_progress.parse_delay_us(raw)


@pytest.mark.unit
def test_delay_parses() -> None:
    assert nixl_progress.parse_delay_us("10000") == 10_000


@pytest.mark.unit
def test_pyproject_declares_the_plugin_vllm_loads() -> None:
    # vLLM calls every `vllm.general_plugins` entry point in each process it starts; the
    # engine's env var alone does nothing without it (a stale install: `make install`).
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    value = project["entry-points"]["vllm.general_plugins"]["pdorch_nixl_progress"]
    module, _, name = value.partition(":")
    assert getattr(import_module(module), name) is nixl_progress.register


def _peer_env(delay_us: int | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo"}
    env.pop(nixl_progress.ENV, None)
    if delay_us is not None:
        env[nixl_progress.ENV] = str(delay_us)
    return env


async def _start_owner(env: dict[str, str]) -> tuple[asyncio.subprocess.Process, dict[str, Any]]:
    owner = await asyncio.create_subprocess_exec(
        *PEER,
        "owner",
        str(4 << 20),
        cwd=REPO,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert owner.stdout is not None
    async with asyncio.timeout(60):
        while not (line := await owner.stdout.readline()).startswith(b"{"):
            assert line, "the owner exited before its hello"  # NIXL logs to stdout too
    return owner, json.loads(line)


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.stdin is not None:
        process.stdin.close()
    try:
        await asyncio.wait_for(process.wait(), timeout=10)
    except TimeoutError:
        process.kill()
        await process.wait()


def _cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


@pytest.mark.integration
async def test_idle_agent_with_delay_does_not_spin_and_serves_reads() -> None:
    env = _peer_env(DELAY_US)
    owner, hello = await _start_owner(env)
    try:
        assert hello["patched"] is True
        # the owner's CPU over a fixed window of pure idling (a measurement, not a wait)
        before, began = _cpu_seconds(owner.pid), time.monotonic()
        await asyncio.sleep(IDLE_WINDOW_S)
        idle = (_cpu_seconds(owner.pid) - before) / (time.monotonic() - began)
        assert idle < IDLE_CPU_MAX, f"idle owner used {idle:.0%} of a core"

        puller = await asyncio.create_subprocess_exec(
            *PEER,
            "pull",
            cwd=REPO,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(
            puller.communicate((json.dumps(hello) + "\n").encode()), timeout=120
        )
        assert puller.returncode == 0, err.decode()[-2000:]
        result = json.loads(out.decode().strip().splitlines()[-1])
        assert result["patched"] is True
        assert len(result["ms"]) == 3  # every READ completed, bytes checked by the puller
    finally:
        await _stop(owner)


@pytest.mark.integration
async def test_without_the_variable_the_plugin_changes_nothing() -> None:
    owner, hello = await _start_owner(_peer_env(None))
    try:
        assert hello["patched"] is False
    finally:
        await _stop(owner)
