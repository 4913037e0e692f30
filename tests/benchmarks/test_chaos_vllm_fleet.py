"""The vllm chaos fleet's plan (no engine started: real vLLM runs only in `pdorch bench chaos
--engine vllm`, see benchmarks/results/reliability.md): its engines are the e2e tests' kind and
the coordinator's fleet file over them loads and follows every engine's KV events, directly or
through the relays of `slow-decode` and `kv-events-lost`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from benchmarks.chaos.fleet import FleetSettings
from benchmarks.chaos.vllm_fleet import BLOCK_SIZE, HEALTH_TIMEOUT_S, VllmChaosFleet
from pdorch.config.fleet import load_fleet_config


@pytest.mark.integration  # free_port binds a socket
def test_the_plan_and_its_fleet_file(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    model.mkdir()
    fleet = VllmChaosFleet(FleetSettings(served_model_name="tiny"), tmp_path, model)
    fleet.plan_engines(tmp_path / "ipc")
    specs = fleet.engine_specs
    assert [(r, s.role.value) for r, s in specs.items()] == [
        ("prefill-0", "prefill"),
        ("decode-0", "decode"),
        ("decode-1", "decode"),
    ]
    ports = [p for s in specs.values() for p in (s.port, s.side_channel_port)]
    assert len(set(ports)) == len(ports)
    for replica_id, spec in specs.items():
        assert spec.kv_transfer and spec.kv_role == "kv_both"  # NixlConnector, as vllm_pair
        assert spec.kv_events_endpoint == f"ipc://{tmp_path}/ipc/{replica_id}-events"
        assert spec.block_size == BLOCK_SIZE and spec.served_model_name == "tiny"

    path = tmp_path / "fleet.yaml"
    path.write_text(fleet.fleet_yaml())
    config = load_fleet_config(path)
    assert config.served_model_name == "tiny" and config.block_size == BLOCK_SIZE
    assert config.health.timeout_s == HEALTH_TIMEOUT_S
    # the bench's first-byte timeout reaches the coordinator (it once got 2 x stall_timeout_s,
    # the 5 s hung threshold itself, whatever --first-byte-timeout-s said)
    assert config.coordinator.first_byte_timeout_s == FleetSettings().first_byte_timeout_s
    assert config.coordinator.stall_timeout_s == FleetSettings().stall_timeout_s
    endpoints = {str(e.id): e for _, pool in config.pools.items() for e in pool.endpoints}
    assert set(endpoints) == set(specs)
    for replica_id, endpoint in endpoints.items():
        assert endpoint.url == specs[replica_id].url
        assert endpoint.kv_events_endpoint == specs[replica_id].kv_events_endpoint
        assert endpoint.kv_events_replay_endpoint == specs[replica_id].kv_events_replay_endpoint


@pytest.mark.integration
async def test_the_relays_sit_between_the_coordinator_and_one_engine(tmp_path: Path) -> None:
    """`slow-decode` / `kv-events-lost` on vLLM: decode-0's URL in the fleet file is the delay
    proxy's, decode-1's KV events come from the relay's tcp PUB, which carries what the engine
    publishes on its bound ipc:// endpoint (a PUB bound there stands in for vLLM) until it
    drops; the other replicas stay direct."""
    fleet = VllmChaosFleet(FleetSettings(served_model_name="tiny"), tmp_path, tmp_path)
    fleet.plan_engines(tmp_path)
    specs = fleet.engine_specs
    ctx = zmq.asyncio.Context()
    engine_pub = ctx.socket(zmq.PUB)
    engine_pub.bind(str(specs["decode-1"].kv_events_endpoint))
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        await fleet.start_relays(("decode-0",), ("decode-1",))
        path = tmp_path / "fleet.yaml"
        path.write_text(fleet.fleet_yaml())
        pools = load_fleet_config(path).pools.items()
        endpoints = {str(e.id): e for _, pool in pools for e in pool.endpoints}
        proxy, relay = fleet.proxies["decode-0"], fleet.relays["decode-1"]
        assert endpoints["decode-0"].url == f"http://127.0.0.1:{proxy.port}"
        assert proxy.target_port == specs["decode-0"].port
        assert endpoints["decode-1"].kv_events_endpoint == f"tcp://127.0.0.1:{relay.port}"
        assert endpoints["decode-1"].kv_events_replay_endpoint == (
            specs["decode-1"].kv_events_replay_endpoint
        )
        for direct in ("prefill-0", "decode-1"):
            assert endpoints[direct].url == specs[direct].url
        assert endpoints["decode-0"].kv_events_endpoint == specs["decode-0"].kv_events_endpoint

        sub.connect(endpoints["decode-1"].kv_events_endpoint)
        received: list[list[bytes]] = []

        async def through() -> None:  # PUB/SUB joins late: publish until one arrives
            while not received:
                await engine_pub.send_multipart([b"decode-1", b"seq", b"batch"])
                if await sub.poll(100):
                    received.append(await sub.recv_multipart())

        await asyncio.wait_for(through(), 10.0)
        assert received[0] == [b"decode-1", b"seq", b"batch"]
        relay.dropping = True

        async def dropped() -> None:  # messages reach the relay and go no further
            while relay.dropped < 3:
                await engine_pub.send_multipart([b"decode-1", b"lost", b"batch"])
                await asyncio.sleep(0.01)

        await asyncio.wait_for(dropped(), 10.0)
        while await sub.poll(200):  # only what was on its way before the drop began
            assert (await sub.recv_multipart())[1] == b"seq"
    finally:
        await fleet.close_relays()
        engine_pub.close(0)
        sub.close(0)
        ctx.term()
