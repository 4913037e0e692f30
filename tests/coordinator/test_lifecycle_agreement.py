"""The coordinator and the fleet simulator run one lifecycle, and agree on every event.

Requests go through the real coordinator (HTTP, simulated engines) with the lifecycle's
recorder on; the recorded trace is replayed through a fresh lifecycle built the way the fleet
simulator builds its own (`build_sim_lifecycle`) and driven through the simulator's adapter
(`SimLifecycle`: the calls `simulator.py` makes). Every routing decision and every replica's
token load after every event must be equal. The replay also sends the simulator's own
"KV transfer landed" event before a P/D request's first token (the coordinator never sees
it): the load must not move there. So the test fails if either caller drifts, e.g. the
simulator counting the decode side's incoming KV as prefill tokens again.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from benchmarks.fleet_sim.lifecycle_adapter import SimLifecycle, build_sim_lifecycle
from pdorch.app.server import run_coordinator
from pdorch.config.fleet import FleetConfig
from pools.http_client import http_client
from router.kv_index import KvIndex
from router.lifecycle_plan import EventKind, LifecycleEvent
from router.vocabulary import PoolName, RouteKind
from tests.coordinator.helpers import MODEL, fleet, long_prompt, sim


def _replay(
    config: FleetConfig, trace: list[LifecycleEvent], members: list[tuple[str, str]]
) -> int:
    """Replay `trace` through the simulator's lifecycle; returns how many events compared."""
    index = KvIndex(config.served_model_name, config.block_size)
    lifecycle = build_sim_lifecycle(config.router_policy_config(), members, {}, index, seed=0)
    sim = SimLifecycle(lifecycle)
    tl = sim.token_load
    ids = [rid for rid, _ in members]

    def loads() -> dict[str, Any]:
        return {rid: tl.tracked_load(rid) for rid in ids}

    with_kv: set[str] = set()
    landed: set[str] = set()
    compared = 0
    for event in trace:
        rid = event.request_id
        where = f"event {compared} ({event.kind} {rid})"
        for replica, static in event.static.items():
            lifecycle.set_static(replica, static)
        if event.kind is EventKind.ADMITTED:
            assert event.request is not None
            plan = sim.arrive(event.request, event.now, lookup=event.lookup)
            assert plan == event.plan, where
            if plan.prefill is not None:
                with_kv.add(rid)
        elif event.kind is EventKind.PREFILL_DONE:
            if event.ok:
                leg = sim.prefill_leg_done(rid, event.now)
            else:
                leg = sim.prefill_leg_failed(rid, event.now)
                with_kv.discard(rid)
            assert leg == event.leg, where
        elif event.kind is EventKind.TOKENS:
            assert event.generated is not None
            if rid in with_kv and rid not in landed:
                before = loads()
                sim.transfer_landed(rid, event.now)  # the simulator's event, not the coordinator's
                landed.add(rid)
                assert loads() == before, f"{where}: KV landing moved the token load"
            sim.token_output(rid, event.now, event.generated)
        elif event.kind is EventKind.KV_LANDED:
            sim.transfer_landed(rid, event.now)
        elif event.kind is EventKind.DECODE_FAILED:
            assert event.reached is not None
            lifecycle.decode_failed(rid, event.now, reached=event.reached)
        elif event.kind is EventKind.DECODE_RETRIED:
            assert lifecycle.retry_decode(rid, event.now) == event.leg, where
        elif event.kind is EventKind.MIGRATED:
            assert event.generated is not None
            assert lifecycle.migrate(rid, event.now, event.generated) == event.leg, where
        elif event.kind is EventKind.FINISHED:
            sim.finished(rid, event.now)
        else:
            lifecycle.aborted(rid, event.now)
        assert loads() == event.loads, where
        compared += 1
    return compared


async def _completion(client: httpx.AsyncClient, prompt: str, stream: bool) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "stream": stream}
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response


SCENARIOS: dict[str, tuple[FleetConfig, set[RouteKind]]] = {
    # 2 prefill + 2 decode; concurrent long (P/D) and short (local) requests, streamed or not
    "pd_and_local": (fleet(prefill=[sim(2)], decode=[sim(2)]), {RouteKind.PD, RouteKind.LOCAL}),
    # a prefill 300x slower than real time times out: the decode side prefills (fallback)
    "fallback": (
        fleet(prefill=[sim(time_scale=300.0)], coordinator={"prefill_timeout_s": 0.3}),
        {RouteKind.FALLBACK, RouteKind.LOCAL},
    ),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_coordinator_and_simulator_agree_on_every_event(scenario: str) -> None:
    config, kinds = SCENARIOS[scenario]
    trace: list[LifecycleEvent] = []
    async with run_coordinator(config) as pd:
        c = pd.coordinator
        c.lifecycle.recorder = trace  # record every request event from here on
        members = [(rid, str(pool)) for pool in PoolName for rid in c.lifecycle.members(pool)]
        async with http_client(base_url=pd.url, timeout=30.0) as client:
            shared = long_prompt(words=200)
            first = await _completion(client, shared, stream=True)
            prompts = [
                (shared + " and then more words", True),  # a cached prefix: overlap > 0 likely
                (long_prompt(), False),
                ("hi", True),
                (long_prompt(words=300), True),
                ("short one", False),
            ]
            rest = await asyncio.gather(*(_completion(client, p, s) for p, s in prompts))
            responses = [first, *rest]
        assert c.token_load.tracked_requests() == 0
    seen = {r.headers["x-pdorch-route"] for r in responses}
    assert seen == {str(k) for k in kinds}, seen
    admitted = [e for e in trace if e.kind is EventKind.ADMITTED]
    assert len(admitted) == len(responses)
    # the trace's final legs are what the coordinator sent (its response headers)
    final: dict[str, str] = {}
    for e in trace:
        leg = e.plan.decode if e.plan is not None else e.leg
        if leg is not None:
            final[e.request_id] = str(leg.kind)
    assert sorted(final.values()) == sorted(r.headers["x-pdorch-route"] for r in responses)
    assert any(e.kind is EventKind.TOKENS for e in trace)
    assert _replay(config, trace, members) == len(trace)
