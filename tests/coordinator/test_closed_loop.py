"""Closed loop on a live simulated fleet: in-process autoscaler + local actuator.

The control loop is the one `pdorch serve --slo-policy` runs: the coordinator's own metrics
(`CoordinatorSource` over its HTTP API, engines scraped) with the actuator's pool counts, the
pdorch planner, `InProcessDriver` over `ScalingControl`. Two halves of the issue's stepped
load, each: low → burst → low, every request of the run succeeds (counted), the pool goes up
once and back down once, and does not move on the steady low segments:

- a long-output burst makes the decode pool scale up (KV usage / concurrency) and back down;
- a long-prompt burst makes the prefill pool scale up (the TTFT queue term, fed by the
  coordinator's queued prefill tokens and the window's arrivals x ISL) and back down.

Engines run in real time (`time_scale` 1) so that the planner's performance model (the
timing model of the same profile) matches them; the policies' short intervals and
stabilization windows are the tests' time scale, set in the policy, not in the defaults.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx

import autoscale.planners  # noqa: F401  (registers every planner)
from autoscale.perf_model import build_perf_model
from autoscale.planner_base import planner_factory
from autoscale.policy import parse_policy
from pdorch.app.scaling import ScalingControl
from pdorch.app.server import RunningCoordinator, run_coordinator
from pdorch.autoscaler.loop import ControlLoop, InProcessDriver
from pdorch.autoscaler.source import ActuatorCounts, loop_source
from pools.http_client import http_client
from tests.coordinator.helpers import MODEL, fleet, long_prompt, sim, sse_events
from tests.waiting import async_wait_until

# Longer than the decode burst's KV oscillation (running streams grow into the KV, finish,
# and let waiting ones in: 0.7 -> 1.0 -> 0.7 within a second) on a starved 2-core box, where
# ticks of a 0.25 s loop land ~0.5-1 s apart: with 1 s the pool went 1 -> 2 -> 1 -> 2 -> 1.
SCALE_DOWN_S = 3.0

POLICY = {
    "pools": {
        "prefill": {"min": 1, "max": 1, "startup_s": 2, "drain_timeout_s": 30},
        "decode": {"min": 1, "max": 2, "startup_s": 2, "drain_timeout_s": 30},
    },
    "intervals": {"reactive_s": 0.25, "predictive_s": 1.0},
    "stabilization": {"scale_up_s": 0.0, "scale_down_s": SCALE_DOWN_S},
    # The default decode cold-start spare (Round 14) would hold the second decode replica the
    # whole run: this test follows the reactive up and down of a 2 s cold start, not the spare.
    "planner": {"cold_start_spare": None},
}


async def _stream(client: httpx.AsyncClient, words: int, max_tokens: int) -> bool:
    body = {
        "model": MODEL,
        "prompt": long_prompt(words),
        "max_tokens": max_tokens,
        "stream": True,
    }
    async with client.stream("POST", "/v1/completions", json=body) as response:
        raw = await response.aread()
    events = sse_events(raw.decode())
    chunks = [e for e in events if isinstance(e, dict) and "choices" in e]
    return (
        response.status_code == 200
        and events[-1:] == ["[DONE]"]
        and not any(isinstance(e, dict) and "error" in e for e in events)
        and len(chunks) >= max_tokens
    )


def _provisioned(pd: RunningCoordinator, pool: str = "decode") -> int:
    scaling = pd.coordinator.scaling
    assert isinstance(scaling, ScalingControl)
    return scaling.actuator.status(pool).provisioned


def _control_loop(pd: RunningCoordinator, policy: Any) -> ControlLoop:
    scaling = pd.coordinator.scaling
    assert isinstance(scaling, ScalingControl)
    planner = planner_factory("pdorch")(policy, build_perf_model(policy))
    return ControlLoop(
        planner,
        loop_source("coordinator", ActuatorCounts(scaling), url=pd.url, admin_token=None),
        InProcessDriver(scaling),
        interval_s=policy.intervals.reactive_s,
    )


async def test_stepped_load_scales_decode_up_and_back_down_and_every_request_succeeds() -> None:
    policy = parse_policy(POLICY)
    config = fleet(
        decode=[sim(1, in_process=False, time_scale=1.0, num_blocks=160)],
        metrics={"interval_s": 0.2},
    )
    async with (
        run_coordinator(config, slo_policy=policy) as pd,
        http_client(base_url=pd.url, timeout=120.0) as client,
    ):
        scaling = pd.coordinator.scaling
        assert isinstance(scaling, ScalingControl)
        loop = _control_loop(pd, policy)
        stop = asyncio.Event()
        running = asyncio.ensure_future(loop.run(stop))
        seen: list[int] = []
        sampler_stop = asyncio.Event()

        async def sample() -> None:
            while not sampler_stop.is_set():
                seen.append(_provisioned(pd))
                await asyncio.sleep(0.1)

        sampler = asyncio.ensure_future(sample())
        results: list[bool] = []
        try:
            # low: a few short requests one at a time; decode stays at 1
            for _ in range(4):
                results.append(await _stream(client, 20, 8))
            assert set(seen) == {1}, seen
            # long-output burst: the KV of the decode replica fills up
            burst = [asyncio.ensure_future(_stream(client, 40, 400)) for _ in range(16)]
            await async_wait_until(
                _async(lambda: _provisioned(pd) == 2), timeout=60, message="decode scaled to 2"
            )
            results += await asyncio.gather(*burst)
            # low again: decode goes back to 1 (drained, nothing lost)
            await async_wait_until(
                _async(lambda: _settled(pd)), timeout=60, message="decode back to 1"
            )
            marker = len(seen)
            for _ in range(4):
                results.append(await _stream(client, 20, 8))
            tail = seen[marker:]
        finally:
            stop.set()
            sampler_stop.set()
            await asyncio.gather(running, sampler)
        assert results == [True] * 24  # every request of the run succeeded
        assert set(tail) == {1}, (tail, _story(scaling, "decode"))  # no flapping when steady
        # one step up and one down: no oscillation in between
        changes = [b for a, b in itertools.pairwise(seen) if a != b]
        assert changes == [2, 1], (changes, _story(scaling, "decode"))
        reasons: set[str] = {d["reason"] for d in scaling.decisions if d["pool"] == "decode"}
        assert "kv-usage" in reasons or "itl-concurrency-observed" in reasons, reasons
        _left_cleanly(scaling, "decode")


def _story(scaling: ScalingControl, pool: str) -> str:
    """The pool's decisions that changed its count, with the binding terms' inputs (for a
    failure message: which term moved the pool, on what load)."""
    lines = []
    for d in scaling.decisions:
        if d["pool"] != pool or d["from"] == d["desired"]:
            continue
        term, inputs = d["inputs"]["details"][pool], d["inputs"]
        lines.append(
            f"{d['at_s']:.2f} {d['from']}->{d['desired']} {d['reason']}"
            f" pools={inputs['pools'][pool]} floor={term['floor']} {term['floor_inputs']}"
            f" reactive={term['reactive']} {term['reactive_reason']} {term['reactive_inputs']}"
            f" observed={inputs['observed']}"
        )
    return "\n".join(lines)


def _left_cleanly(scaling: ScalingControl, pool: str) -> None:
    """The added replica left without cutting a request: by a clean drain when it became ready,
    or, on a busy box where the burst ended before it was ready, by a cancelled start."""
    stats = scaling.actuator.stats
    if stats.started[pool]:
        (_, outcome), *_ = stats.drains
        assert not outcome.timed_out and outcome.cut == 0, outcome
    else:
        assert not stats.drains and stats.stopped[pool] == 0, stats


def _settled(pd: RunningCoordinator, pool: str = "decode") -> bool:
    scaling = pd.coordinator.scaling
    assert isinstance(scaling, ScalingControl)
    status = scaling.actuator.status(pool)
    return status.ready == 1 and status.draining == 0 and status.pending == 0


def _async(condition: Any) -> Any:
    async def check() -> bool:
        return bool(condition())

    return check


PREFILL_POLICY = {
    "pools": {
        "prefill": {"min": 1, "max": 2, "startup_s": 2, "drain_timeout_s": 30},
        "decode": {"min": 1, "max": 1, "startup_s": 2, "drain_timeout_s": 30},
    },
    "intervals": {"reactive_s": 0.25, "predictive_s": 1.0},
    "stabilization": {"scale_up_s": 0.0, "scale_down_s": SCALE_DOWN_S},
}
BURST = 16  # concurrent long prompts
BURST_WORDS = 700  # about 5.5k prompt tokens each (the sims' byte-level tokenizer)


async def test_long_prompt_burst_scales_prefill_up_and_back_down_and_every_request_succeeds() -> (
    None
):
    policy = parse_policy(PREFILL_POLICY)
    config = fleet(
        prefill=[sim(1, in_process=False, time_scale=1.0)],
        decode=[sim(1, in_process=False, time_scale=1.0)],
        metrics={"interval_s": 0.2},
    )
    async with (
        run_coordinator(config, slo_policy=policy) as pd,
        http_client(base_url=pd.url, timeout=120.0) as client,
    ):
        scaling = pd.coordinator.scaling
        assert isinstance(scaling, ScalingControl)
        loop = _control_loop(pd, policy)
        # the first read only primes the source's window: not planned, nothing recorded
        assert await loop.tick() is None and not scaling.decisions
        stop = asyncio.Event()
        running = asyncio.ensure_future(loop.run(stop))
        seen: list[int] = []
        sampler_stop = asyncio.Event()

        async def sample() -> None:
            while not sampler_stop.is_set():
                seen.append(_provisioned(pd, "prefill"))
                await asyncio.sleep(0.1)

        sampler = asyncio.ensure_future(sample())
        results: list[bool] = []
        try:
            # low: short prompts one at a time; prefill stays at 1
            for _ in range(4):
                results.append(await _stream(client, 20, 8))
            assert set(seen) == {1}, seen
            # long-prompt burst: prompt tokens queue up on the prefill replica
            burst = [asyncio.ensure_future(_stream(client, BURST_WORDS, 8)) for _ in range(BURST)]
            await async_wait_until(
                _async(lambda: _provisioned(pd, "prefill") == 2),
                timeout=60,
                message="prefill scaled to 2",
            )
            results += await asyncio.gather(*burst)
            # low again: prefill goes back to 1 (drained, its KV leases pulled; nothing lost)
            await async_wait_until(
                _async(lambda: _settled(pd, "prefill")), timeout=60, message="prefill back to 1"
            )
            marker = len(seen)
            for _ in range(4):
                results.append(await _stream(client, 20, 8))
            tail = seen[marker:]
        finally:
            stop.set()
            sampler_stop.set()
            await asyncio.gather(running, sampler)
            await loop.source.aclose()
        assert results == [True] * (8 + BURST)  # every request of the run succeeded
        assert set(tail) == {1}, (tail, _story(scaling, "prefill"))  # no flapping when steady
        changes = [b for a, b in itertools.pairwise(seen) if a != b]
        assert changes == [2, 1], (changes, _story(scaling, "prefill"))
        ups = [
            d
            for d in scaling.decisions
            if d["pool"] == "prefill" and d["from"] == 1 and d["desired"] == 2
        ]
        assert ups, scaling.decisions
        # the binding term is a TTFT term (clamped to the pool's max), fed by the window's
        # arrivals x ISL that CoordinatorSource reads from the coordinator's histograms: the
        # reactive queue term, or, when the whole burst lands in one window, the floor's
        # throughput term on that window's load
        prefill = ups[0]["inputs"]["details"]["prefill"]
        assert ups[0]["reason"] in {"ttft-queue", "ttft-throughput", "max"}, ups[0]
        queue, floor = prefill["reactive_inputs"], prefill["floor_inputs"]
        if prefill["reactive"] >= prefill["floor"]:
            assert prefill["reactive_reason"] == "ttft-queue" and prefill["reactive"] >= 2, prefill
            assert queue["isl_uncached"] > 1000 and queue["lambda_tok_s"] > queue["mu_tok_s"]
        else:
            assert prefill["floor"] >= 2 and floor["isl"] > 1000 and floor["need"] > 1, prefill
        _left_cleanly(scaling, "prefill")
