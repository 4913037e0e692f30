"""The fleet file: examples load, every error names its field path (and file + line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdorch.config.fleet import (
    FleetConfig,
    FleetConfigError,
    demo_fleet_config,
    load_fleet_config,
    parse_fleet_config,
)
from pools.launch_spec import (
    SIM_RUNTIME_FIELDS,
    VLLM_RUNTIME_FIELDS,
    SimLaunchSpec,
    VllmLaunchSpec,
    replica_ids,
)
from pools.sim.settings import SimEngineSettings
from pools.vllm_spec import VllmEngineSpec
from router.tokenization import TokenizerMode

EXAMPLES = sorted((Path(__file__).parents[2] / "deploy" / "examples").glob("fleet-*.yaml"))
LAUNCH_ONLY = {"kind", "count", "kv_events", "in_process", "start_timeout_s", "switchable"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> FleetConfigError:
    with pytest.raises(FleetConfigError) as info:
        load_fleet_config(write(tmp_path, text))
    return info.value


def test_the_three_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"fleet-sim.yaml", "fleet-vllm-cpu.yaml", "fleet-static.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_loads(path: Path) -> None:
    config = load_fleet_config(path)
    assert config.pools.decode.size() >= 1
    config.router_policy_config()
    config.tokenization_config("http://127.0.0.1:1")


def test_demo_example_is_two_prefill_two_decode_8b_h100_real_time() -> None:
    config = load_fleet_config(EXAMPLES[0].parent / "fleet-sim.yaml")
    for pool in (config.pools.prefill, config.pools.decode):
        assert pool.size() == 2
        for spec in pool.launch:
            assert isinstance(spec, SimLaunchSpec)
            assert (spec.model_profile, spec.gpu, spec.time_scale) == ("llama-3.1-8b", "h100", 1.0)
    assert config == demo_fleet_config()  # `pdorch serve` without --config runs the same
    fast = config.with_sim_time_scale(0.01)
    assert fast == demo_fleet_config(time_scale=0.01)
    assert all(
        s.time_scale == 0.01 for s in fast.pools.decode.launch if isinstance(s, SimLaunchSpec)
    )


def test_bad_endpoint_url_names_path_file_and_line(tmp_path: Path) -> None:
    err = error_of(
        tmp_path,
        "served_model_name: m\n"
        "pools:\n"
        "  decode:\n"
        "    endpoints:\n"
        "      - url: http://127.0.0.1:8000\n"
        "      - url: not-a-url\n",
    )
    assert len(err.issues) == 1
    issue = err.issues[0]
    assert issue.path == "pools.decode.endpoints[1].url"
    assert issue.line == 6
    assert str(err).startswith(f"{tmp_path / 'fleet.yaml'}:6: pools.decode.endpoints[1].url: ")


def test_unknown_fields_are_errors_with_path(tmp_path: Path) -> None:
    err = error_of(
        tmp_path,
        "served_model_name: m\n"
        "pools:\n"
        "  decode:\n"
        "    launch:\n"
        "      - kind: sim\n"
        "        gpus: h100\n"
        "        time_scale: 0\n"
        "colour: blue\n",
    )
    found = {(i.path, i.line) for i in err.issues}
    assert ("pools.decode.launch[0].gpus", 6) in found  # the union tag `sim` is not in the path
    assert ("pools.decode.launch[0].time_scale", 7) in found
    assert ("colour", 8) in found


def test_unknown_profile_and_launch_kind(tmp_path: Path) -> None:
    err = error_of(
        tmp_path,
        "served_model_name: m\npools:\n  decode:\n    launch:\n"
        "      - {kind: sim, gpu: h900}\n      - {kind: docker}\n",
    )
    paths = [i.path for i in err.issues]
    assert "pools.decode.launch[0].gpu" in paths
    assert any(p.startswith("pools.decode.launch[1]") for p in paths)
    assert "h900" in str(err)


def test_policy_errors_name_the_policy_field(tmp_path: Path) -> None:
    err = error_of(
        tmp_path,
        "served_model_name: m\npools:\n  decode:\n    endpoints: [{url: 'http://a:1'}]\n"
        "  prefill:\n    policy: {name: dynamo, params: {temperature: -1}}\n",
    )
    assert err.issues[0].path == "pools.prefill.policy.params.temperature"
    assert err.issues[0].line == 6
    err = error_of(
        tmp_path,
        "served_model_name: m\npools:\n  decode:\n    endpoints: [{url: 'http://a:1'}]\n"
        "    policy: {name: fastest}\n",
    )
    assert err.issues[0].path == "pools.decode.policy.name"
    assert "fastest" in err.issues[0].message


def test_vllm_rules_apply_at_load_time(tmp_path: Path) -> None:
    err = error_of(
        tmp_path,
        "served_model_name: m\nblock_size: 16\npools:\n  decode:\n"
        "    launch: [{kind: vllm, model: /models/x}]\n",
    )
    assert err.issues[0].path == "block_size"
    assert "multiple of 32" in err.issues[0].message
    assert "pools.decode.launch[0]" in err.issues[0].message
    err = error_of(
        tmp_path,
        "served_model_name: m\nblock_size: 32\npools:\n  decode:\n"
        "    launch: [{kind: vllm, model: /models/x, cpu_cores: 'zero'}]\n",
    )
    assert err.issues[0].path == "pools.decode.launch[0].cpu_cores"
    err = error_of(
        tmp_path,
        "served_model_name: m\nblock_size: 32\npools:\n  decode:\n"
        "    launch: [{kind: vllm, model: /models/x, port: 8000}]\n",
    )
    assert err.issues[0].path == "pools.decode.launch[0].port"  # chosen at run time


def test_duplicate_ids_and_empty_fleet(tmp_path: Path) -> None:
    err = error_of(
        tmp_path,
        "served_model_name: m\npools:\n  decode:\n    endpoints:\n"
        "      - {url: 'http://a:1', id: d}\n      - {url: 'http://b:1', id: d}\n",
    )
    assert (err.issues[0].path, err.issues[0].line) == ("pools.decode.endpoints[1].id", 6)
    err = error_of(
        tmp_path, "served_model_name: m\npools: {prefill: {endpoints: [{url: 'http://a:1'}]}}\n"
    )
    assert err.issues[0].path == "pools.decode"
    err = error_of(tmp_path, "pools: {decode: {endpoints: [{url: 'http://a:1'}]}}\n")
    assert err.issues[0].path == "served_model_name"


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    err = error_of(tmp_path, "served_model_name: m\npools:\n  decode: {endpoints: [ {url: x]}\n")
    assert err.issues[0].line == 3
    assert str(err).startswith(f"{tmp_path / 'fleet.yaml'}:3: YAML: ")
    err = error_of(tmp_path, "- just\n- a list\n")
    assert "mapping" in str(err)


def test_relative_paths_resolve_against_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "served_model_name: m\nblock_size: 32\npools:\n  decode:\n"
        "    launch: [{kind: vllm, model: models/tiny}]\n"
        "tokenizer: {mode: hf, model_dir: models/tiny}\n"
        "launch: {log_dir: logs}\n",
    )
    config = load_fleet_config(path)
    spec = config.pools.decode.launch[0]
    assert isinstance(spec, VllmLaunchSpec)
    assert spec.model == (tmp_path / "models" / "tiny").resolve()
    assert config.tokenizer.model_dir == (tmp_path / "models" / "tiny").resolve()
    assert config.launch.log_dir == (tmp_path / "logs").resolve()


def test_defaults_and_router_views() -> None:
    config = parse_fleet_config(
        {"served_model_name": "m", "pools": {"decode": {"endpoints": [{"url": "http://d:1"}]}}}
    )
    router = config.router_policy_config()
    assert (router.prefill.name, router.decode.name) == ("token_load", "token_load_decode")
    assert config.tokenizer.mode is TokenizerMode.ENGINE
    tok = config.tokenization_config("http://d:1")
    assert tok.engine_url == "http://d:1"
    assert config.health.interval_s <= 0.5 and config.health.timeout_s <= 0.5
    assert config.coordinator.api_keys == [] and config.coordinator.admin_token is None


def test_replica_ids_static_then_launched() -> None:
    config = parse_fleet_config(
        {
            "served_model_name": "m",
            "pools": {
                "decode": {
                    "endpoints": [{"url": "http://d:1", "id": "edge"}, {"url": "http://d:2"}],
                    "launch": [{"kind": "sim", "count": 2}],
                }
            },
        }
    )
    ids = [rid for rid, _ in replica_ids("decode", config.pools.decode)]
    assert ids == ["edge", "decode-1", "decode-2", "decode-3"]


def test_launch_specs_track_the_engine_settings() -> None:
    """A field added to A's VllmEngineSpec or C2's SimEngineSettings must be added here too
    (or listed as a run-time field), so the fleet file can set every engine option."""
    vllm = set(VllmLaunchSpec.model_fields) - LAUNCH_ONLY
    assert vllm == set(VllmEngineSpec.model_fields) - VLLM_RUNTIME_FIELDS
    sim = set(SimLaunchSpec.model_fields) - LAUNCH_ONLY
    assert sim == set(SimEngineSettings.model_fields) - SIM_RUNTIME_FIELDS


def test_model_validate_without_file_reports_paths() -> None:
    with pytest.raises(FleetConfigError) as info:
        parse_fleet_config({"served_model_name": "m", "pools": {"decode": {"endpoints": [{}]}}})
    assert info.value.issues[0].path == "pools.decode.endpoints[0].url"
    assert info.value.issues[0].line is None
    FleetConfig.model_validate(
        {"served_model_name": "m", "pools": {"decode": {"endpoints": [{"url": "http://d:1"}]}}}
    )


def test_migration_settings_default_and_bad_values_are_named(tmp_path: Path) -> None:
    base = 'served_model_name: m\npools:\n  decode:\n    endpoints: [{url: "http://d:1"}]\n'
    config = load_fleet_config(write(tmp_path, base))
    assert config.coordinator.migration_limit == 3
    assert config.coordinator.stall_timeout_s == 10.0
    for field, value in (("migration_limit", "-1"), ("stall_timeout_s", "0")):
        err = error_of(tmp_path, base + f"coordinator:\n  {field}: {value}\n")
        assert err.issues[0].path == f"coordinator.{field}", err.issues
        assert err.issues[0].line == 6
