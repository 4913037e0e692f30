"""What a fleet file says about one pool's members: static endpoints and launch specs.

These models live in `pools` (not in `pdorch.config`) because the launcher reads them and
`pools` must not import `pdorch`; `pdorch.config.fleet` composes them with the routing parts.

- `StaticEndpointSpec`: an engine somebody else runs.
- `VllmLaunchSpec`: `pools.vllm_spec.VllmEngineSpec` minus what is chosen at run time (role,
  ports, KV event endpoints and topic) and what the fleet fixes for every engine (served model
  name, block size); `count` copies.
- `SimLaunchSpec`: `pools.sim.settings.SimEngineSettings` minus the same run-time and
  fleet-wide fields; `count` copies, in-process (default) or as `pdorch engine sim` processes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pools.hardware import GpuProfileName, HardwareSpec, ModelProfileName
from pools.replica import ReplicaEndpoint
from pools.roles import EngineRole
from pools.sim.settings import SimEngineSettings
from pools.vllm_spec import Dtype, EngineDevice, HashAlgo, VllmEngineSpec
from transfer.transports import KvTransport
from transfer.vllm_config import KvLoadFailurePolicy, KvRole

_ZMQ = re.compile(r"^(tcp|ipc|inproc)://.+")
_HTTP = re.compile(r"^https?://[^/\s]+(/\S*)?$")


def _check_zmq(value: str | None) -> str | None:
    if value is not None and not _ZMQ.match(value):
        raise ValueError(f"must be a ZMQ endpoint (tcp://, ipc://, inproc://), got {value!r}")
    return value


def _check_http(value: str | None) -> str | None:
    if value is not None and not _HTTP.match(value):
        raise ValueError(f"must be an http(s) URL like http://host:8000, got {value!r}")
    return value.rstrip("/") if value is not None else None


class StaticEndpointSpec(BaseModel):
    """An engine that already runs (vLLM or a simulated one) at `url`."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="Base URL of the engine's OpenAI server, e.g. http://h:8000.")
    id: str | None = Field(
        default=None,
        min_length=1,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Replica id (default: `<pool>-<n>`).",
    )
    kv_events_endpoint: str | None = Field(
        default=None, description="The engine's KV event publisher to connect to (it binds)."
    )
    kv_events_replay_endpoint: str | None = Field(
        default=None, description="The engine's KV event replay (ROUTER) endpoint."
    )
    kv_events_topic: str = Field(default="", description="Topic frame the engine publishes.")
    metrics_url: str | None = Field(default=None, description="Default: `<url>/metrics`.")
    hardware: HardwareSpec | None = Field(
        default=None,
        description="The engine's timing profile (pools/hardware.py); default: the pool's.",
    )

    _url = field_validator("url", "metrics_url")(_check_http)
    _zmq = field_validator("kv_events_endpoint", "kv_events_replay_endpoint")(_check_zmq)

    def to_endpoint(
        self,
        *,
        replica_id: str,
        pool: str,
        model: str,
        block_size: int,
        hardware: HardwareSpec | None = None,
    ) -> ReplicaEndpoint:
        """The fleet's entry for this endpoint (`id` wins over `replica_id` when set; its own
        `hardware` over the pool's `hardware`)."""
        tps, kv_cost = with_hardware(self.hardware or hardware)
        return ReplicaEndpoint(
            replica_id=self.id or replica_id,
            pool=pool,
            url=self.url,
            model=model,
            block_size=block_size,
            kv_events_endpoint=self.kv_events_endpoint,
            kv_events_replay_endpoint=self.kv_events_replay_endpoint,
            kv_events_topic=self.kv_events_topic,
            metrics_url=self.metrics_url,
            prefill_tokens_per_s=tps,
            decode_s_per_kv_token=kv_cost,
        )


def with_hardware(hardware: HardwareSpec | None) -> tuple[float | None, float | None]:
    """(prefill tokens/s, decode s per KV token) of a replica's profile, (None, None) without."""
    return hardware.costs() if hardware is not None else (None, None)


# Fields of the engine settings the launcher fills in (not allowed in a launch spec).
VLLM_RUNTIME_FIELDS = frozenset(
    {
        "role",
        "port",
        "side_channel_port",
        "kv_events_endpoint",
        "kv_events_replay_endpoint",
        "kv_events_topic",
        "served_model_name",
        "block_size",
    }
)
SIM_RUNTIME_FIELDS = frozenset(
    {
        "role",
        "port",
        "kv_port",
        "kv_events_endpoint",
        "kv_events_replay_endpoint",
        "kv_events_topic",
        "served_model_name",
        "block_size",
        "engine_id",
    }
)
_LAUNCH_ONLY = frozenset(
    {"kind", "count", "kv_events", "in_process", "start_timeout_s", "switchable"}
)
_SWITCHABLE_HELP = (
    "Start in role `both` (vLLM: `kv_both` labelled both), so the replica can move between "
    "the prefill and decode pools without a restart (`pdorch scale move`)."
)


class VllmLaunchSpec(BaseModel):
    """`count` real vLLM engines started by pdorch (see `VllmEngineSpec` for each field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["vllm"]
    count: int = Field(default=1, ge=0, le=64, description="Engines to start.")
    kv_events: bool = Field(
        default=True, description="Publish KV events (ipc:// endpoints chosen at run time)."
    )
    start_timeout_s: float | None = Field(
        default=None, gt=0, description="Readiness deadline (default: the fleet's launch one)."
    )
    switchable: bool = Field(default=False, description=_SWITCHABLE_HELP)
    model: Path = Field(description="Model directory (a HF checkpoint on local disk).")
    host: str = "127.0.0.1"
    side_channel_host: str = "127.0.0.1"
    kv_transfer: bool = True
    kv_lease_s: int | None = Field(default=None, ge=1)
    kv_load_failure_policy: KvLoadFailurePolicy = "fail"
    kv_role: KvRole = "kv_both"
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: HashAlgo = "sha256_cbor"
    max_model_len: int = Field(default=2048, ge=16)
    cpu_cores: str | None = Field(
        default=None, description="OpenMP cores; unset: one core each, round-robin."
    )
    kv_cache_space_gib: int | None = Field(default=1, ge=1)
    num_gpu_blocks_override: int | None = Field(default=None, ge=1)
    enforce_eager: bool = True
    dtype: Dtype = "bfloat16"
    device: EngineDevice = "cpu"
    gpu_ids: tuple[int, ...] | None = None
    host_ip: str | None = None
    nixl_progress_delay_us: int | None = Field(default=None, ge=0)
    extra_args: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check_switchable(self) -> VllmLaunchSpec:
        # a kv_producer cannot decode a remote prefill, a kv_consumer cannot serve one
        if self.switchable and self.kv_role != "kv_both":
            raise ValueError(f"switchable needs kv_role kv_both, got {self.kv_role}")
        return self

    def engine_spec(
        self,
        *,
        role: EngineRole,
        port: int,
        side_channel_port: int,
        served_model_name: str,
        block_size: int,
        kv_events_endpoint: str | None = None,
        kv_events_replay_endpoint: str | None = None,
        kv_events_topic: str = "kv-events",
        cpu_cores: str | None = None,
    ) -> VllmEngineSpec:
        """The full engine spec once the run-time values are known (validates it)."""
        fields: dict[str, Any] = self.model_dump(exclude=set(_LAUNCH_ONLY))
        if cpu_cores is not None and self.cpu_cores is None:
            fields["cpu_cores"] = cpu_cores
        return VllmEngineSpec(
            **fields,
            role=role,
            port=port,
            side_channel_port=side_channel_port,
            served_model_name=served_model_name,
            block_size=block_size,
            kv_events_endpoint=kv_events_endpoint,
            kv_events_replay_endpoint=kv_events_replay_endpoint,
            kv_events_topic=kv_events_topic,
        )


class SimLaunchSpec(BaseModel):
    """`count` simulated engines (see `SimEngineSettings` for each field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["sim"]
    count: int = Field(default=1, ge=0, le=1024, description="Engines to start.")
    kv_events: bool = Field(
        default=True, description="Publish KV events (ipc:// endpoints chosen at run time)."
    )
    in_process: bool = Field(
        default=True,
        description="Serve in the coordinator's process (one event loop); false: one "
        "`pdorch engine sim` process each.",
    )
    start_timeout_s: float | None = Field(default=None, gt=0)
    switchable: bool = Field(default=False, description=_SWITCHABLE_HELP)
    host: str = "127.0.0.1"
    model_profile: ModelProfileName = Field(default="tiny", description="pools.sim.profiles.MODELS")
    gpu: GpuProfileName = Field(default="h100", description="pools.sim.profiles.GPUS")
    tp: int = Field(default=1, ge=1)
    kv_memory_gb: float | None = Field(default=None, gt=0)
    time_scale: float = Field(default=1.0, gt=0, description="Real seconds per simulated one.")
    num_blocks: int | None = Field(default=None, ge=2)
    max_num_seqs: int = Field(default=256, ge=1)
    max_num_batched_tokens: int = Field(default=8192, ge=1)
    max_model_len: int = Field(default=8192, ge=2)
    enable_prefix_caching: bool = True
    tokenizer: str | None = None
    lora_modules: tuple[str, ...] = Field(
        default=(), description="LoRA adapters loaded: `name` or `name=path` each."
    )
    kv_events_buffer_steps: int = Field(default=10_000, ge=1)
    kv_transport: KvTransport = KvTransport.AUTO
    kv_host: str = "127.0.0.1"
    kv_block_bytes: int = Field(default=4096, ge=32)
    kv_lease_s: float = Field(default=30.0, gt=0)
    kv_load_timeout_s: float = Field(default=5.0, gt=0)
    kv_load_failure_policy: KvLoadFailurePolicy = "fail"

    def settings(
        self,
        *,
        role: EngineRole,
        served_model_name: str,
        block_size: int,
        kv_events_endpoint: str | None = None,
        kv_events_replay_endpoint: str | None = None,
        kv_events_topic: str = "kv-events",
        engine_id: str | None = None,
    ) -> SimEngineSettings:
        """The engine server's settings (port 0: the OS picks it when binding)."""
        fields: dict[str, Any] = self.model_dump(exclude=set(_LAUNCH_ONLY))
        return SimEngineSettings(
            **fields,
            role=role,
            port=0,
            kv_port=0,
            served_model_name=served_model_name,
            block_size=block_size,
            kv_events_endpoint=kv_events_endpoint,
            kv_events_replay_endpoint=kv_events_replay_endpoint,
            kv_events_topic=kv_events_topic,
            engine_id=engine_id,
        )


LaunchSpec = Annotated[VllmLaunchSpec | SimLaunchSpec, Field(discriminator="kind")]


class PoolMembers(BaseModel):
    """A pool's replicas as configured: static endpoints and/or engines to launch."""

    model_config = ConfigDict(extra="forbid")

    endpoints: list[StaticEndpointSpec] = Field(default_factory=list)
    launch: list[LaunchSpec] = Field(default_factory=list)
    hardware: HardwareSpec | None = Field(
        default=None,
        description="Timing profile of the pool's replicas (pools/hardware.py): routing "
        "constants; an endpoint's own `hardware` wins.",
    )

    def size(self) -> int:
        """Replicas at start: static endpoints plus every launch spec's count."""
        return len(self.endpoints) + sum(spec.count for spec in self.launch)


class LaunchSettings(BaseModel):
    """How launched engines are started and stopped."""

    model_config = ConfigDict(extra="forbid")

    start_timeout_s: float = Field(
        default=600.0, gt=0, description="Readiness deadline per engine."
    )
    stop_grace_s: float = Field(
        default=20.0, ge=0, description="SIGTERM → SIGKILL grace (processes)."
    )
    log_dir: Path | None = Field(
        default=None, description="Engine logs (default: a temp dir, removed on exit)."
    )

    @field_validator("log_dir")
    @classmethod
    def _resolve(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        base = (info.context or {}).get("base_dir")
        if value is None or value.is_absolute() or base is None:
            return value
        return (Path(base) / value).resolve()


def replica_ids(pool: str, config: PoolMembers) -> list[tuple[str, int | None]]:
    """Replica ids in a pool in member order: static endpoints (their `id` or `<pool>-<n>`),
    then each launch spec's copies; with the launch spec index (None for static ones)."""
    ids: list[tuple[str, int | None]] = []
    n = 0
    for endpoint in config.endpoints:
        ids.append((endpoint.id or f"{pool}-{n}", None))
        n += 1
    for index, spec in enumerate(config.launch):
        for _ in range(spec.count):
            ids.append((f"{pool}-{n}", index))
            n += 1
    return ids
