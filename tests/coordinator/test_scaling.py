"""Scaling a live fleet: drain under load, scale up, role switch. Real engine processes."""

from __future__ import annotations

import asyncio
import os

from autoscale.policy import parse_policy
from pdorch.app.server import RunningCoordinator, run_coordinator
from pools.drain import held_leases
from pools.http_client import http_client
from pools.pd_protocol import prefill_leg_body
from tests.coordinator.helpers import (
    MODEL,
    assert_openai_error,
    fleet,
    long_prompt,
    sim,
)
from tests.coordinator.scaling_helpers import scaling_of as _scaling
from tests.coordinator.scaling_helpers import stream_long as _stream
from tests.coordinator.scaling_helpers import stream_ok as _ok
from tests.waiting import async_wait_until


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _on_replicas(pd: RunningCoordinator, ids: list[str], at_least: int) -> bool:
    return all(pd.coordinator.requests.in_flight(r) >= at_least for r in ids)


async def test_drain_decode_2_to_1_under_32_streams_loses_and_duplicates_nothing() -> None:
    config = fleet(decode=[sim(2, in_process=False, time_scale=1.0)])
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=60.0) as client,
    ):
        scaling = _scaling(pd)
        pids = {r: pd.fleet.pid_of(r) for r in ("decode-0", "decode-1")}
        tasks = [asyncio.ensure_future(_stream(client, 60)) for _ in range(32)]
        await async_wait_until(
            lambda: _on_replicas(pd, ["decode-0", "decode-1"], 4),
            timeout=30,
            message="streams on both decode replicas",
        )
        assert scaling.set("decode", replicas=1)["applied"]
        status = scaling.actuator.status("decode")
        assert (status.ready, status.draining) == (1, 1)
        # the draining replica left routing at once
        draining = [r.replica_id for r in pd.coordinator.fleet.replicas("decode") if r.draining]
        assert len(draining) == 1
        assert draining[0] not in [r.replica_id for r in pd.coordinator.routable("decode")]
        assert pd.coordinator.requests.in_flight(draining[0]) > 0  # it still has work
        results = await asyncio.gather(*tasks)
        await scaling.actuator.idle(60)
        bad = [r for r in results if not _ok(r, 60)]
        assert bad == [], [(b["decode"], b["events"][-3:], len(b["events"])) for b in bad]
        assert len({r["id"] for r in results}) == 32  # every request answered once
        assert sum(1 for r in results if r["decode"] == draining[0]) > 0
        metrics = (await client.get("/metrics")).text
        assert 'pdorch_requests_total{endpoint="completions",status="200"} 32.0' in metrics
        assert "pdorch_decode_retries_total 0.0" in metrics
        assert "pdorch_stream_errors_total 0.0" in metrics
        assert 'pdorch_autoscale_desired{pool="decode"} 1.0' in metrics
        status = scaling.actuator.status("decode")
        assert (status.ready, status.pending, status.draining) == (1, 0, 0)
        assert draining[0] not in pd.coordinator.fleet
        pid = pids[draining[0]]
        assert pid is not None and not _alive(pid)
        (pool, outcome), *_ = scaling.actuator.stats.drains
        assert pool == "decode" and not outcome.timed_out and outcome.cut == 0
        metrics = (await client.get("/metrics")).text
        count = 'pdorch_drain_duration_seconds_count{outcome="drained",pool="decode"} 1.0'
        assert count in metrics
        assert 'pdorch_pool_replicas{pool="decode",state="draining"} 0.0' in metrics


async def test_scale_up_replica_is_pending_then_joins_routing() -> None:
    config = fleet(decode=[sim(1, in_process=False)])
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=60.0) as client,
    ):
        scaling = _scaling(pd)
        scaling.set("decode", delta=+1)
        status = scaling.actuator.status("decode")
        assert (status.ready, status.pending) == (1, 1)
        assert [r.replica_id for r in pd.coordinator.routable("decode")] == ["decode-0"]
        await scaling.actuator.idle(60)
        status = scaling.actuator.status("decode")
        assert (status.ready, status.pending) == (2, 0)
        routable = [r.replica_id for r in pd.coordinator.routable("decode")]
        assert routable == ["decode-0", "decode-1"]
        assert pd.coordinator.kv_events_live("decode-1")
        results = await asyncio.gather(*(_stream(client, 64) for _ in range(8)))
        assert [r for r in results if not _ok(r, 64)] == []
        assert "decode-1" in {r["decode"] for r in results}  # load spreads onto it
        assert scaling.pinned == {"decode": 2}


async def test_drain_timeout_ends_streams_with_an_error_event() -> None:
    config = fleet(decode=[sim(2, in_process=False, time_scale=1.0)])
    policy = parse_policy({"pools": {"decode": {"min": 1, "drain_timeout_s": 0.3}}})
    async with (
        run_coordinator(config, slo_policy=policy) as pd,
        http_client(base_url=pd.url, timeout=60.0) as client,
    ):
        scaling = _scaling(pd)
        tasks = [asyncio.ensure_future(_stream(client, 3000)) for _ in range(4)]
        await async_wait_until(
            lambda: _on_replicas(pd, ["decode-0", "decode-1"], 1),
            timeout=30,
            message="streams on both decode replicas",
        )
        scaling.set("decode", replicas=1)
        await scaling.actuator.idle(30)
        (_, outcome), *_ = scaling.actuator.stats.drains
        assert outcome.timed_out and outcome.cut >= 1
        cut = []
        for task in tasks:
            if task.done():
                cut.append(task.result())
        assert len(cut) == outcome.cut
        for result in cut:
            assert result["decode"] == outcome.replica_id
            assert result["events"][-1] == "[DONE]"
            error = result["events"][-2]["error"]
            assert "drain_timeout_s" in error["message"]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_drain_timeout_answers_non_streamed_requests_with_an_openai_error() -> None:
    config = fleet(decode=[sim(2, in_process=False, time_scale=1.0)])
    policy = parse_policy({"pools": {"decode": {"min": 1, "drain_timeout_s": 0.3}}})
    async with (
        run_coordinator(config, slo_policy=policy) as pd,
        http_client(base_url=pd.url, timeout=60.0) as client,
    ):
        scaling = _scaling(pd)
        body = {"model": MODEL, "prompt": long_prompt(), "max_tokens": 3000}
        tasks = [asyncio.ensure_future(client.post("/v1/completions", json=body)) for _ in range(4)]
        await async_wait_until(
            lambda: _on_replicas(pd, ["decode-0", "decode-1"], 1),
            timeout=30,
            message="requests on both decode replicas",
        )
        scaling.set("decode", replicas=1)
        await scaling.actuator.idle(30)
        (_, outcome), *_ = scaling.actuator.stats.drains
        assert outcome.timed_out and outcome.cut >= 1

        async def answered() -> bool:
            return sum(t.done() for t in tasks) >= outcome.cut

        await async_wait_until(answered, timeout=10, message="the cut requests answered")
        cut = [t.result() for t in tasks if t.done()]
        assert len(cut) == outcome.cut  # the others still run on the kept replica
        for response in cut:
            error = assert_openai_error(response, 503)
            assert error["code"] == "replica_drained"
            assert outcome.replica_id in error["message"]
            assert "drain_timeout_s" in error["message"]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_role_switch_under_load_all_requests_succeed() -> None:
    switchable = sim(1, in_process=False, time_scale=1.0, switchable=True)
    config = fleet(prefill=[switchable], decode=[{**switchable, "count": 2}])
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=60.0) as client,
    ):
        scaling = _scaling(pd)
        pids_before = pd.fleet.pids()
        assert scaling.actuator.switchable("decode") == ["decode-0", "decode-1"]
        tasks = [asyncio.ensure_future(_stream(client, 40)) for _ in range(16)]
        await async_wait_until(
            lambda: _on_replicas(pd, ["decode-1"], 2), timeout=30, message="load on decode-1"
        )
        moved = scaling.move("decode-1", "prefill")
        assert moved["from_pool"] == "decode"
        results = await asyncio.gather(*tasks)
        await scaling.actuator.idle(60)
        assert [r for r in results if not _ok(r, 40)] == []
        replica = pd.coordinator.fleet.get("decode-1")
        assert replica is not None and replica.pool == "prefill" and replica.routable
        assert pd.fleet.pids() == pids_before  # no restart
        assert scaling.actuator.stats.role_switches[("decode", "prefill")] == 1
        # it now serves prefill legs
        prefilled: set[str] = set()
        for _ in range(12):
            result = await _stream(client, 4)
            assert _ok(result, 4), result
            prefilled.add(result["prefill"])
        assert "decode-1" in prefilled


async def test_prefill_drain_waits_for_held_kv_leases() -> None:
    """A prefill replica holding an unpulled KV lease stays until the lease expires, even with
    no request of the coordinator on it (the decode side never came for it)."""
    config = fleet(prefill=[sim(2, in_process=False, kv_lease_s=1.5)])
    async with (
        run_coordinator(config) as pd,
        http_client(timeout=30.0) as client,
    ):
        scaling = _scaling(pd)
        replica = pd.coordinator.fleet.get("prefill-1")
        assert replica is not None
        body = prefill_leg_body({"model": MODEL, "prompt": long_prompt()})
        answer = await client.post(f"{replica.url}/v1/completions", json=body)
        assert answer.status_code == 200, answer.text
        assert await held_leases(client, replica.url) == 1
        pid = pd.fleet.pid_of("prefill-1")
        scaling.set("prefill", replicas=1)  # newest first on ties: prefill-1
        await scaling.actuator.idle(30)
        (pool, outcome), *_ = scaling.actuator.stats.drains
        assert (pool, outcome.replica_id, outcome.timed_out) == ("prefill", "prefill-1", False)
        assert outcome.duration_s >= 1.0  # waited for the lease, not for requests
        assert pid is not None and not _alive(pid)


async def test_a_failed_start_is_reported_with_its_engine_log_tail() -> None:
    config = fleet(decode=[sim(1, in_process=False)])
    async with run_coordinator(config) as pd:
        scaling = _scaling(pd)
        # new decode replicas copy this template: a deadline no engine process can meet
        template = pd.fleet.templates["decode"]
        pd.fleet.templates["decode"] = template.model_copy(update={"start_timeout_s": 0.001})
        scaling.set("decode", delta=+1)
        await scaling.actuator.idle(60)
        assert scaling.actuator.stats.failed_starts == {"decode": 1}
        (failure,) = scaling.actuator.stats.failures
        assert (failure.pool, failure.replica_id) == ("decode", "decode-1")
        assert "no ready line" in failure.reason
        assert "engine sim" in failure.log_tail  # the log's first line: the command
        report = scaling.actuator.start_report("decode-1")
        assert "failed starts: {'decode': 1}" in report
        assert "decode-1 (decode) failed after" in report
        assert report.count("engine sim") >= 1
        assert [r.replica_id for r in pd.coordinator.routable("decode")] == ["decode-0"]
