"""Recall on a live fleet: a scale-up takes back a draining replica instead of a cold start.

Real simulated-engine processes behind a real coordinator; the planner's decisions reach the
actuator through the in-process autoscaler's driver (`InProcessDriver`), as they do under
`pdorch serve --slo-policy`. The rule is `autoscale.actuators.recall` (the simulator's
actuator follows the same one).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from typer.testing import CliRunner

from autoscale.decision import ScaleDecision
from autoscale.policy import parse_policy
from autoscale.signals import Observation, Pool, PoolStatus
from pdorch.app.scaling import ScalingControl
from pdorch.app.server import RunningCoordinator, run_coordinator
from pdorch.autoscaler.loop import InProcessDriver
from pdorch.cli import app
from pools.http_client import http_client
from tests.coordinator.helpers import fleet, sim
from tests.coordinator.scaling_helpers import scaling_of as _scaling
from tests.coordinator.scaling_helpers import stream_long, stream_ok
from tests.waiting import async_wait_until


async def _stream(client: httpx.AsyncClient, max_tokens: int) -> dict[str, Any]:
    result = await stream_long(client, max_tokens)
    ok = stream_ok(result, max_tokens)
    return {"ok": ok, "decode": result["decode"], "tail": result["events"][-3:]}


async def _on_both(pd: RunningCoordinator, at_least: int) -> bool:
    return all(pd.coordinator.requests.in_flight(r) >= at_least for r in ("decode-0", "decode-1"))


async def _decide(scaling: ScalingControl, desired: dict[Pool, int], reason: str) -> None:
    """One planner decision, applied as the in-process autoscaler applies it."""
    counts = scaling.actuator.current()
    obs = Observation(
        now=0.0,
        window_s=5.0,
        pools={p: counts.get(p, PoolStatus()) for p in Pool},
    )
    reasons = dict.fromkeys(desired, reason)
    await InProcessDriver(scaling).apply(ScaleDecision(0.0, desired, reasons), obs)


async def test_a_scale_up_recalls_the_draining_replica_and_loses_nothing() -> None:
    policy = parse_policy({"pools": {"decode": {"min": 1, "max": 3, "drain_timeout_s": 120}}})
    config = fleet(decode=[sim(2, in_process=False, time_scale=1.0)])
    async with (
        run_coordinator(config, slo_policy=policy) as pd,
        http_client(base_url=pd.url, timeout=120.0) as client,
    ):
        scaling = _scaling(pd)
        pids = pd.fleet.pids()
        tasks = [asyncio.ensure_future(_stream(client, 150)) for _ in range(12)]
        await async_wait_until(
            lambda: _on_both(pd, 2),
            timeout=30,
            message="streams on both decode replicas",
        )
        await _decide(scaling, {Pool.DECODE: 1}, "consolidation")
        status = scaling.actuator.status("decode")
        assert (status.ready, status.pending, status.draining) == (1, 0, 1)
        (drained,) = [r.replica_id for r in pd.coordinator.fleet.replicas("decode") if r.draining]
        assert drained not in [r.replica_id for r in pd.coordinator.routable("decode")]
        on_it = pd.coordinator.requests.in_flight(drained)
        assert on_it > 0  # it drains with requests in flight

        # the planner asks for +1 while the replica still drains: it comes back, no new process
        await _decide(scaling, {Pool.DECODE: 2}, "itl-concurrency")
        status = scaling.actuator.status("decode")
        assert (status.ready, status.pending, status.draining) == (2, 0, 0)
        assert drained in [r.replica_id for r in pd.coordinator.routable("decode")]
        assert pd.coordinator.requests.in_flight(drained) > 0  # its streams were not cut
        assert scaling.actuator.stats.recalls["decode"] == 1
        assert pd.fleet.pids() == pids  # no process started (and none stopped)

        results = await asyncio.gather(*tasks)
        await scaling.actuator.idle(60)
        assert [r for r in results if not r["ok"]] == []
        assert sum(1 for r in results if r["decode"] == drained) >= on_it
        assert scaling.actuator.stats.drains == []  # the drain never finished: it was cancelled
        assert scaling.actuator.stats.started["decode"] == 0
        assert sorted(r.replica_id for r in pd.coordinator.fleet.replicas("decode")) == [
            "decode-0",
            "decode-1",
        ]
        # and it takes new work again
        after = await asyncio.gather(*(_stream(client, 8) for _ in range(8)))
        assert all(r["ok"] for r in after)
        assert drained in {r["decode"] for r in after}

        metrics = (await client.get("/metrics")).text
        assert 'pdorch_recalls_total{pool="decode"} 1.0' in metrics
        assert 'pdorch_pool_replicas{pool="decode",state="ready"} 2.0' in metrics
        assert "pdorch_stream_errors_total 0.0" in metrics
        runner = CliRunner(env={"COLUMNS": "200"})
        shown = await asyncio.to_thread(
            runner.invoke, app, ["scale", "status", "--url", pd.url, "--json"]
        )
        assert shown.exit_code == 0, shown.output
        decode = json.loads(shown.stdout)["pools"]["decode"]
        assert (decode["ready"], decode["draining"], decode["recalled"]) == (2, 0, 1)
        table = await asyncio.to_thread(runner.invoke, app, ["scale", "status", "--url", pd.url])
        assert table.exit_code == 0, table.output
        assert "0 (1 recalled)" in table.output


async def test_a_scale_up_of_prefill_moves_a_draining_decode_replica_instead_of_starting() -> None:
    """Role switching on: a decode replica draining to stop serves prefill instead, when its
    drain ends before a cold start would (drain deadline 30 s + switch 5 s < startup 120 s)."""
    policy = parse_policy(
        {
            "role_switching": True,
            "pools": {
                "prefill": {"min": 1, "max": 3, "startup_s": 120},
                "decode": {"min": 1, "max": 3, "drain_timeout_s": 30},
            },
        }
    )
    switchable = sim(1, in_process=False, time_scale=1.0, switchable=True)
    config = fleet(prefill=[switchable], decode=[{**switchable, "count": 2}])
    async with (
        run_coordinator(config, slo_policy=policy) as pd,
        http_client(base_url=pd.url, timeout=120.0) as client,
    ):
        scaling = _scaling(pd)
        pids = pd.fleet.pids()
        tasks = [asyncio.ensure_future(_stream(client, 60)) for _ in range(8)]
        await async_wait_until(
            lambda: _on_both(pd, 1),
            timeout=30,
            message="streams on both decode replicas",
        )
        await _decide(scaling, {Pool.DECODE: 1}, "consolidation")
        (drained,) = [r.replica_id for r in pd.coordinator.fleet.replicas("decode") if r.draining]
        await _decide(scaling, {Pool.PREFILL: 2}, "ttft-queue")
        prefill = scaling.actuator.status("prefill")
        assert (prefill.ready, prefill.pending) == (1, 1)  # the move is on its way
        assert scaling.actuator.status("decode").draining == 0  # it no longer leaves decode
        assert scaling.actuator.stats.drain_moves[("decode", "prefill")] == 1
        results = await asyncio.gather(*tasks)
        await scaling.actuator.idle(60)
        assert [r for r in results if not r["ok"]] == []
        replica = pd.coordinator.fleet.get(drained)
        assert replica is not None and replica.pool == "prefill" and replica.routable
        assert pd.fleet.pids() == pids  # the same processes: no cold start, no stop
        assert scaling.actuator.stats.started["prefill"] == 0
        prefill = scaling.actuator.status("prefill")
        assert (prefill.ready, prefill.pending) == (2, 0)
        metrics = (await client.get("/metrics")).text
        assert 'pdorch_drain_moves_total{from_pool="decode",to_pool="prefill"} 1.0' in metrics
