"""The vllm chaos fleet's plan (no engine started: real vLLM runs only in `pdorch bench chaos
--engine vllm`, see benchmarks/results/reliability.md): its engines are the e2e tests' kind and
the coordinator's fleet file over them loads and follows every engine's KV events."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.chaos.fleet import FleetSettings
from benchmarks.chaos.vllm_fleet import BLOCK_SIZE, VllmChaosFleet
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
    assert config.health.timeout_s == 2.0
    endpoints = {str(e.id): e for _, pool in config.pools.items() for e in pool.endpoints}
    assert set(endpoints) == set(specs)
    for replica_id, endpoint in endpoints.items():
        assert endpoint.url == specs[replica_id].url
        assert endpoint.kv_events_endpoint == specs[replica_id].kv_events_endpoint
        assert endpoint.kv_events_replay_endpoint == specs[replica_id].kv_events_replay_endpoint
