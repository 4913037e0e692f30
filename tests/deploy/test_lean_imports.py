"""The coordinator image is lean (deploy/images/coordinator.Containerfile: `pip install
.[kubernetes]`, no torch, no vLLM, no matplotlib): `pdorch serve` and `pdorch engine sim` must not
import them. Each probe runs in a fresh interpreter, builds the real thing (the coordinator over the
embedded demo fleet with its simulated engines launched; a simulated engine serving), and reports
which heavy modules ended up in `sys.modules`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.deploy.kustomize import REPO

pytestmark = pytest.mark.integration  # starts the coordinator and simulated engines

# Only in the `vllm` / `bench` extras (pyproject.toml), so absent from the coordinator image.
HEAVY = ("torch", "vllm", "matplotlib", "nixl", "vllm_router")

_REPORT = f"""
import json, sys
heavy = {HEAVY!r}
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
"""

COORDINATOR_PROBE = (
    """
import asyncio
import pdorch.cli  # every command registered, as `pdorch` loads it
from pdorch.cli.serve import demo_fleet
from pdorch.config.fleet import parse_fleet_config
from pdorch.app.server import run_coordinator

async def main():
    fleet = parse_fleet_config(demo_fleet(), source="demo")
    async with run_coordinator(fleet, host="127.0.0.1", port=0) as running:
        assert running.coordinator is not None
asyncio.run(main())
"""
    + _REPORT
)

SIM_ENGINE_PROBE = (
    """
import asyncio
import pdorch.cli
from pools.sim.server import SimServer
from pools.sim.settings import SimEngineSettings

async def main():
    server = SimServer(SimEngineSettings(role="prefill", host="127.0.0.1", port=0,
                                         model_profile="llama-3.1-8b", gpu="h100"))
    await server.start()
    await server.stop()
asyncio.run(main())
"""
    + _REPORT
)


@pytest.mark.parametrize(
    "probe", [COORDINATOR_PROBE, SIM_ENGINE_PROBE], ids=["pdorch-serve", "pdorch-engine-sim"]
)
def test_the_coordinator_and_the_sim_engine_import_no_heavy_package(probe: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported == []
