"""The vLLM engine spec: command line and environment for CPU and GPU, and refused settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from pools.roles import EngineRole
from pools.vllm_spec import VllmEngineSpec
from transfer.vllm_config import nixl_engine_env, nixl_kv_transfer_config

MODEL = Path("/models/tiny")
BASE_ENV = {"PATH": "/usr/bin", "HOME": "/home/test"}


def cpu_spec(**overrides: Any) -> VllmEngineSpec:
    settings: dict[str, Any] = {
        "role": "prefill",
        "model": MODEL,
        "served_model_name": "tiny",
        "port": 8101,
        "side_channel_port": 5601,
        "kv_events_endpoint": "ipc:///tmp/p-events",
        "kv_events_replay_endpoint": "ipc:///tmp/p-replay",
        "max_model_len": 1024,
        "num_gpu_blocks_override": 96,
        "cpu_cores": "0",
    }
    settings.update(overrides)
    return VllmEngineSpec.model_validate(settings)


def gpu_spec(**overrides: Any) -> VllmEngineSpec:
    settings: dict[str, Any] = {
        "role": "decode",
        "model": MODEL,
        "host": "0.0.0.0",
        "port": 8200,
        "side_channel_host": "10.0.0.7",
        "side_channel_port": 5700,
        "device": "cuda",
        "gpu_ids": [2, 3],
        "block_size": 16,
        "enforce_eager": False,
        "kv_events_endpoint": "tcp://*:5557",
        "kv_lease_s": 45,
    }
    settings.update(overrides)
    return VllmEngineSpec.model_validate(settings)


def flag(argv: list[str], name: str) -> str:
    """The value following `name` in `argv` (fails the test when absent)."""
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


def test_cpu_argv_starts_the_openai_server_module_with_the_spec_flags() -> None:
    argv = cpu_spec().argv("/venv/bin/python")

    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "serve" not in argv
    assert flag(argv, "--model") == str(MODEL)
    assert flag(argv, "--served-model-name") == "tiny"
    assert flag(argv, "--host") == "127.0.0.1"
    assert flag(argv, "--port") == "8101"
    assert flag(argv, "--block-size") == "32"
    assert flag(argv, "--max-model-len") == "1024"
    assert flag(argv, "--dtype") == "bfloat16"
    assert flag(argv, "--prefix-caching-hash-algo") == "sha256_cbor"
    assert flag(argv, "--num-gpu-blocks-override") == "96"
    assert "--enable-prefix-caching" in argv
    assert "--enforce-eager" in argv


def test_cpu_argv_has_nixl_connector_and_kv_events_json() -> None:
    argv = cpu_spec().argv("python")

    assert json.loads(flag(argv, "--kv-transfer-config")) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": "cpu",
        "kv_load_failure_policy": "fail",
    }
    assert json.loads(flag(argv, "--kv-events-config")) == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "ipc:///tmp/p-events",
        "replay_endpoint": "ipc:///tmp/p-replay",
        "topic": "kv-events",
    }


def test_cpu_env_sets_side_channel_ucx_cores_and_kv_space() -> None:
    env = cpu_spec().env(BASE_ENV)

    assert env["PATH"] == "/usr/bin"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
    assert env["VLLM_HOST_IP"] == "127.0.0.1"
    assert env["UCX_TLS"] == "tcp,self,sm"
    assert env["UCX_NET_DEVICES"] == "lo"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in env


RESERVED = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def test_unpinned_connector_engine_on_two_cores_keeps_one_core_for_openmp() -> None:
    # vLLM would keep none of 2 cores free and pair two OpenMP threads on one (vllm_spec.env).
    assert cpu_spec(cpu_cores=None).env(BASE_ENV, host_cores=2)[RESERVED] == "1"


@pytest.mark.parametrize(
    ("overrides", "base", "host_cores"),
    [
        ({}, {}, 2),  # cores pinned: VLLM_CPU_OMP_THREADS_BIND decides, nothing is reserved
        ({"cpu_cores": None, "kv_transfer": False}, {}, 2),  # no connector: vLLM keeps 1 of 2
        ({"cpu_cores": None}, {}, 3),  # enough cores for vLLM's own reservation
        ({"cpu_cores": None}, {}, 1),
        ({"cpu_cores": None}, {}, None),  # core count unknown
        ({"cpu_cores": None}, {RESERVED: "2"}, 2),  # the caller's own choice wins
        ({"cpu_cores": None, "device": "cuda"}, {}, 2),
    ],
)
def test_reserved_cores_are_left_to_vllm_otherwise(
    overrides: dict[str, Any], base: dict[str, str], host_cores: int | None
) -> None:
    env = cpu_spec(**overrides).env({**BASE_ENV, **base}, host_cores=host_cores)
    assert env.get(RESERVED) == base.get(RESERVED)


DELAY = "PDORCH_NIXL_PROGRESS_DELAY_US"


@pytest.mark.parametrize(
    ("overrides", "base", "host_cores", "expected"),
    [
        # small hosts: NIXL's progress thread would spin a core per idle engine
        ({}, {}, 2, "10000"),
        ({"device": "cuda", "gpu_ids": None}, {}, 8, "10000"),
        # a big host keeps NIXL's default, and so does an unknown one
        ({}, {}, 9, None),
        ({}, {}, None, None),
        # the spec's own value wins, everywhere; 0 removes an inherited one (NIXL spins)
        ({"nixl_progress_delay_us": 500}, {}, 64, "500"),
        ({"nixl_progress_delay_us": 500}, {DELAY: "7"}, 2, "500"),
        ({"nixl_progress_delay_us": 0}, {DELAY: "7"}, 2, None),
        # unset in the spec, the caller's environment wins
        ({}, {DELAY: "2000"}, 2, "2000"),
        ({}, {DELAY: "2000"}, 64, "2000"),
    ],
)
def test_nixl_progress_delay_env(
    overrides: dict[str, Any], base: dict[str, str], host_cores: int | None, expected: str | None
) -> None:
    env = cpu_spec(**overrides).env({**BASE_ENV, **base}, host_cores=host_cores)
    assert env.get(DELAY) == expected


def test_no_connector_gets_no_nixl_progress_delay() -> None:
    assert DELAY not in cpu_spec(kv_transfer=False).env(BASE_ENV, host_cores=2)


def test_gpu_argv_and_env() -> None:
    spec = gpu_spec()
    argv = spec.argv("python")
    env = spec.env(BASE_ENV)

    transfer = json.loads(flag(argv, "--kv-transfer-config"))
    assert transfer["kv_buffer_device"] == "cuda"
    assert transfer["kv_role"] == "kv_both"
    assert transfer["kv_connector_extra_config"] == {"kv_lease_duration": 45}
    assert json.loads(flag(argv, "--kv-events-config"))["endpoint"] == "tcp://*:5557"
    assert "replay_endpoint" not in json.loads(flag(argv, "--kv-events-config"))
    assert flag(argv, "--block-size") == "16"
    assert "--enforce-eager" not in argv
    assert "--num-gpu-blocks-override" not in argv
    assert flag(argv, "--served-model-name") == "tiny"  # the model directory's name

    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.7"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5700"
    assert env["VLLM_HOST_IP"] == "10.0.0.7"  # the side-channel host unless host_ip is given
    assert gpu_spec(host_ip="10.0.0.8").env(BASE_ENV)["VLLM_HOST_IP"] == "10.0.0.8"
    for cpu_only in ("UCX_TLS", "UCX_NET_DEVICES", "VLLM_CPU_KVCACHE_SPACE"):
        assert cpu_only not in env
    assert spec.url == "http://127.0.0.1:8200"


def test_no_kv_transfer_and_no_events_leave_their_flags_out() -> None:
    spec = cpu_spec(
        kv_transfer=False,
        kv_events_endpoint=None,
        kv_events_replay_endpoint=None,
        role=EngineRole.BOTH,
    )
    argv = spec.argv("python")
    env = spec.env(BASE_ENV)
    assert "--kv-transfer-config" not in argv
    assert "--kv-events-config" not in argv
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in env


def test_extra_args_come_last_verbatim() -> None:
    argv = cpu_spec(extra_args=["--max-num-seqs", "8"]).argv("python")
    assert argv[-2:] == ["--max-num-seqs", "8"]


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"block_size": 16}, "block_size", "multiple of 32"),
        ({"role": "router"}, "role", "prefill"),
        ({"port": 70000}, "port", "65535"),
        ({"side_channel_port": 0}, "side_channel_port", "greater than or equal to 1"),
        ({"cpu_cores": "zero"}, "cpu_cores", "cpu_cores must look like"),
        ({"gpu_ids": [0]}, "gpu_ids", "device cuda"),
        ({"kv_events_endpoint": "localhost:5557"}, "kv_events_endpoint", "ZMQ endpoint"),
        ({"num_gpu_blocks_override": 8}, "num_gpu_blocks_override", "ceil(1024 / 32) = 32"),
        ({"kv_events_endpoint": None}, "kv_events_replay_endpoint", "needs kv_events_endpoint"),
        ({"kv_lease_s": 0}, "kv_lease_s", "greater than or equal to 1"),
        ({"device": "tpu"}, "device", "cpu"),
        ({"prefix_caching_hash_algo": "md5"}, "prefix_caching_hash_algo", "sha256_cbor"),
        ({"unknown_flag": 1}, "unknown_flag", "Extra inputs are not permitted"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(
    overrides: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        cpu_spec(**overrides)
    message = str(refused.value)
    assert field in message
    assert words in message


def test_gpu_block_size_16_is_allowed_but_ids_must_be_non_negative() -> None:
    assert gpu_spec(block_size=16).block_size == 16
    with pytest.raises(ValidationError, match="gpu_ids"):
        gpu_spec(gpu_ids=[-1])


def test_transfer_builders_take_plain_values() -> None:
    assert nixl_kv_transfer_config("cpu", engine_id="e1", load_failure_policy="recompute") == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": "cpu",
        "kv_load_failure_policy": "recompute",
        "engine_id": "e1",
    }
    remote = nixl_engine_env(
        side_channel_host="10.1.2.3", side_channel_port=5600, host_ip="10.1.2.3", cpu_only=True
    )
    assert remote["UCX_TLS"] == "tcp,self,sm"
    assert "UCX_NET_DEVICES" not in remote  # `lo` would cut a CPU engine off other hosts
    with pytest.raises(ValueError, match="side_channel_port"):
        nixl_engine_env(
            side_channel_host="127.0.0.1", side_channel_port=0, host_ip="127.0.0.1", cpu_only=True
        )
    with pytest.raises(ValueError, match="lease_s"):
        nixl_kv_transfer_config("cuda", lease_s=0)
