"""The in-process autoscaler of a several-model fleet: one control loop per model, each over its
own coordinator, actuator and SLO policy (`pdorch/autoscaler/in_process.py`, the loops
`pdorch serve` runs). A long-output burst on the second model scales its decode pool; the
first model's pool, watched by its own loop all along, stays at one replica.

Engines run in real time as in `test_closed_loop.py` (the planner's performance model is the
timing model of the same profile); the policies' short intervals are the test's time scale.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from pdorch.app.scaling import ScalingControl
from pdorch.app.server import RunningCoordinator, run_coordinator
from pdorch.autoscaler.in_process import model_control_loops, run_loops
from pdorch.config.fleet import parse_fleet_config
from pools.http_client import http_client
from tests.coordinator.helpers import long_prompt, sim
from tests.waiting import async_wait_until

QUIET = "chat-a"
BUSY = "chat-b"
POLICY = {
    "pools": {
        "prefill": {"min": 1, "max": 1, "startup_s": 2, "drain_timeout_s": 30},
        "decode": {"min": 1, "max": 2, "startup_s": 2, "drain_timeout_s": 30},
    },
    "intervals": {"reactive_s": 0.25, "predictive_s": 1.0},
    "stabilization": {"scale_up_s": 0.0, "scale_down_s": 30.0},
    # without the default decode cold-start spare (Round 14), which would raise both models'
    # decode pools at once: this test tells a burst on one model from quiet on the other
    "planner": {"cold_start_spare": None},
}


def _scaling(running: RunningCoordinator, model: str) -> ScalingControl:
    scaling = running.models[model][0].scaling
    assert isinstance(scaling, ScalingControl)
    return scaling


def _decode(running: RunningCoordinator, model: str) -> int:
    return _scaling(running, model).actuator.status("decode").provisioned


async def test_a_burst_on_one_model_scales_its_pool_and_not_the_others(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(json.dumps(POLICY))

    def model(name: str) -> dict[str, object]:
        engine = {"in_process": False, "time_scale": 1.0}
        return {
            "served_model_name": name,
            "pools": {
                "prefill": {"launch": [sim(1, **engine)]},
                "decode": {"launch": [sim(1, num_blocks=160, **engine)]},
            },
            "pd": {"min_uncached_tokens": 32},
            "slo_policy": str(policy),
        }

    config = parse_fleet_config(
        {
            "models": [model(QUIET), model(BUSY)],
            "coordinator": {"port": 0},
            "metrics": {"interval_s": 0.2},
        }
    )
    async with (
        run_coordinator(config) as running,
        http_client(base_url=running.url, timeout=120.0) as client,
    ):
        loops = model_control_loops(running, None)
        assert set(loops) == {QUIET, BUSY}  # every model with a policy gets its own loop
        stop = asyncio.Event()
        task = asyncio.ensure_future(run_loops(loops, stop))
        quiet_seen: list[int] = []

        async def burst_stream() -> bool:
            body = {"model": BUSY, "prompt": long_prompt(40), "max_tokens": 400, "stream": True}
            async with client.stream("POST", "/v1/completions", json=body) as response:
                await response.aread()
            quiet_seen.append(_decode(running, QUIET))
            return response.status_code == 200

        async def busy_scaled() -> bool:
            quiet_seen.append(_decode(running, QUIET))
            return _decode(running, BUSY) == 2

        try:
            burst = [asyncio.ensure_future(burst_stream()) for _ in range(16)]
            await async_wait_until(busy_scaled, timeout=60, message=f"{BUSY} decode scaled to 2")
            assert all(await asyncio.gather(*burst))
        finally:
            stop.set()
            await task
        assert set(quiet_seen) == {1}, quiet_seen
        quiet = _scaling(running, QUIET).decisions
        busy = _scaling(running, BUSY).decisions
        # the quiet model's loop ran all along, and held its pool at one
        assert any(d["pool"] == "decode" for d in quiet), quiet
        assert all(d["desired"] == 1 for d in quiet if d["pool"] == "decode"), quiet
        assert any(d["pool"] == "decode" and d["desired"] == 2 for d in busy), busy
        # each loop read its own model: the busy one saw the burst's arrivals, the quiet none
        assert all(d["inputs"]["arrival_rps"] == 0 for d in quiet), quiet
        assert any(d["inputs"]["arrival_rps"] > 0 for d in busy), busy
