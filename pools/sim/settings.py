"""Settings of one simulated engine *server* (what `pdorch engine sim` takes on its command line).

The engine core has its own `pools.sim.config.EngineConfig`; these settings add what only a
server needs (HTTP, ZMQ, tokenizer, time scale, KV memory and transport) and derive the core's
config from them in `SimEngine`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from pools.roles import EngineRole
from transfer.transports import KvTransport
from transfer.vllm_config import KvLoadFailurePolicy


class SimEngineSettings(BaseModel):
    """Everything one simulated engine server needs. Field docs double as CLI help."""

    model_config = ConfigDict(extra="forbid")

    role: EngineRole = Field(
        EngineRole.BOTH,
        description="What the pool uses this engine for. Like vLLM's kv_both, every engine can "
        "still serve prefill-only, decode-with-remote-KV and colocated requests.",
    )
    host: str = Field("127.0.0.1", description="HTTP bind address.")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port (0: the OS picks one).")
    model_profile: str = Field("tiny", description="Model profile (pools.sim.profiles.MODELS).")
    gpu: str = Field("h100", description="GPU profile (pools.sim.profiles.GPUS).")
    tp: int = Field(1, ge=1, description="Tensor-parallel degree of the simulated engine.")
    kv_memory_gb: float | None = Field(
        None, gt=0, description="KV pool size in GB (default: vLLM's memory accounting)."
    )
    time_scale: float = Field(
        1.0,
        gt=0,
        description="Real seconds per simulated second: 0.01 runs 100x faster than the GPU "
        "would. Latency metrics are reported in simulated seconds.",
    )
    block_size: int = Field(16, ge=1, description="Tokens per KV block (vLLM --block-size).")
    num_blocks: int | None = Field(
        None, ge=2, description="KV blocks incl. the null block (vLLM --num-gpu-blocks-override)."
    )
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    max_model_len: int = Field(8192, ge=2)
    enable_prefix_caching: bool = True
    served_model_name: str | None = Field(
        None, description="Name clients send as `model` (default: the model profile name)."
    )
    lora_modules: list[str] = Field(
        default_factory=list,
        description="LoRA adapters this engine has loaded, each `name` or `name=path` (vLLM "
        "--lora-modules): a request whose `model` is the name runs with the adapter, whose "
        "name and path salt its block hashes as in vLLM; /v1/models lists them with `parent`.",
    )
    tokenizer: str | None = Field(
        None,
        description="Local Hugging Face tokenizer directory (e.g. the tiny model), or "
        "'builtin:words' (English words in, readable sentences out: pools/sim/words.py). "
        "Without it a byte-level fallback tokenizer is used "
        "(pools.sim.tokenization.ByteTokenizer).",
    )
    kv_events_endpoint: str | None = Field(
        None,
        description="ZMQ endpoint for KV events (bound if it has '*' or '::' or is ipc/inproc, "
        "else connected, as vLLM does). None: no events.",
    )
    kv_events_replay_endpoint: str | None = Field(
        None, description="ZMQ ROUTER endpoint for replaying buffered event batches."
    )
    kv_events_topic: str = "kv-events"
    kv_events_buffer_steps: int = Field(10_000, ge=1)
    engine_id: str | None = Field(None, description="KV engine id (default: a random uuid4).")
    kv_transport: KvTransport = Field(
        KvTransport.AUTO,
        description="How KV blocks move between simulated engines: nixl, tcp, auto (nixl when "
        "importable) or none (no P/D).",
    )
    kv_host: str = Field("127.0.0.1", description="Side-channel host other engines reach.")
    kv_port: int = Field(0, ge=0, le=65535, description="Side-channel port (0: the OS picks).")
    kv_block_bytes: int = Field(
        4096, ge=32, description="Bytes of real memory per KV block (scaled down)."
    )
    kv_lease_s: float = Field(
        30.0, gt=0, description="Real seconds a prefill engine holds blocks nobody pulled."
    )
    kv_load_timeout_s: float = Field(
        5.0, gt=0, description="Real seconds a decode engine waits for a KV pull before failing."
    )
    kv_load_failure_policy: KvLoadFailurePolicy = "fail"
