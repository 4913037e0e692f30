"""Fleet files with several models (`models:`): backward compatible one-model files, every
error naming its field (`models[i]...`) and line, per-model views for the coordinator."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdorch.config.fleet import (
    FleetConfig,
    FleetConfigError,
    load_fleet_config,
    parse_fleet_config,
)
from pools.launch_spec import SimLaunchSpec

SIM = "{kind: sim, count: 1}"
TWO_MODELS = f"""\
models:
  - served_model_name: a
    pools:
      prefill: {{launch: [{SIM}]}}
      decode: {{launch: [{SIM}]}}
    slo_policy: policies/a.yaml
  - served_model_name: b
    block_size: 32
    tokenizer: {{mode: chars}}
    pools:
      colocated: {{launch: [{SIM}]}}
coordinator: {{port: 0}}
"""


def load(tmp_path: Path, text: str) -> FleetConfig:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return load_fleet_config(path)


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(FleetConfigError) as info:
        load(tmp_path, text)
    return str(info.value)


def test_two_models_give_one_model_views_and_the_top_level_reads_as_the_first(
    tmp_path: Path,
) -> None:
    config = load(tmp_path, TWO_MODELS)
    assert isinstance(config, FleetConfig)
    assert config.model_names() == ["a", "b"]
    a, b = config.model_configs()
    assert (a.served_model_name, a.block_size, a.pools.prefill.size()) == ("a", 16, 1)
    assert (b.served_model_name, b.block_size, b.tokenizer.mode.value) == ("b", 32, "chars")
    assert b.pools.colocated is not None and b.pools.prefill.size() == 0
    assert a.models is None and b.models is None  # each a plain one-model config
    assert a.slo_policy == str((tmp_path / "policies" / "a.yaml").resolve())
    assert config.served_model_name == "a" and config.pools == a.pools
    # shared sections are every model's
    assert a.coordinator.port == b.coordinator.port == 0
    # the copies the tests make keep every model
    fast = config.with_sim_time_scale(0.01)
    assert fast.model_names() == ["a", "b"]
    colocated = fast.model_configs()[1].pools.colocated
    assert colocated is not None
    launch = colocated.launch[0]
    assert isinstance(launch, SimLaunchSpec) and launch.time_scale == 0.01


def test_one_model_file_is_one_model() -> None:
    config = parse_fleet_config(
        {"served_model_name": "m", "pools": {"decode": {"launch": [{"kind": "sim"}]}}}
    )
    assert config.models is None
    assert config.model_configs() == [config]
    assert config.model_names() == ["m"]


def test_errors_name_the_models_field_and_line(tmp_path: Path) -> None:
    bad_policy = TWO_MODELS.replace(
        f"colocated: {{launch: [{SIM}]}}", f"colocated: {{policy: {{name: nope}}, launch: [{SIM}]}}"
    )
    assert ":11: models[1].pools.colocated.policy.name: unknown policy 'nope'" in error_of(
        tmp_path, bad_policy
    )
    nothing_serves = TWO_MODELS.replace(f"colocated: {{launch: [{SIM}]}}", "prefill: {}")
    assert ":10: models[1].pools.decode: no replica can serve requests" in error_of(
        tmp_path, nothing_serves
    )
    typo = TWO_MODELS.replace("block_size: 32", "block_sise: 32")
    assert ":8: models[1].block_sise: Extra inputs are not permitted" in error_of(tmp_path, typo)
    twice = TWO_MODELS.replace("served_model_name: b", "served_model_name: a")
    assert ":7: models[1].served_model_name: model 'a' is listed twice" in error_of(tmp_path, twice)


def test_models_and_top_level_model_fields_do_not_mix(tmp_path: Path) -> None:
    mixed = "served_model_name: x\n" + TWO_MODELS
    assert ":1: served_model_name: with models: every model gives its own" in error_of(
        tmp_path, mixed
    )
    neither = "coordinator: {port: 0}\n"
    assert "served_model_name: Field required (or list the models in models:)" in error_of(
        tmp_path, neither
    )
    synced = TWO_MODELS + "sync: {bind: 'tcp://127.0.0.1:0'}\n"
    assert "sync: not supported with models:" in error_of(tmp_path, synced)
