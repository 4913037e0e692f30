"""KV-cache events the engine core emits, shaped exactly like vLLM's (`vllm.distributed.kv_events`).

msgspec Structs with `tag=True` encode as msgpack maps whose first key is `"type"` (the class
name) and, with `omit_defaults=True`, leave out fields still at their default: the same bytes
vLLM's publisher sends, so `pools/sim/kv_publisher.py` only wraps them in
`[ts, [event, ...], data_parallel_rank]`. Field order and defaults follow vLLM 0.32.
"""

from __future__ import annotations

from typing import Any

import msgspec

MEDIUM_GPU = "GPU"
FULL_ATTENTION = "full_attention"


class _KVCacheEventBase(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(_KVCacheEventBase):
    """Full blocks newly cached (one event per allocation step per request), chained on
    `parent_block_hash`; `token_ids` covers all blocks (`block_size` x len(block_hashes))."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class BlockRemoved(_KVCacheEventBase):
    """A cached block evicted (its hash dropped), one hash per event, as vLLM emits them."""

    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(_KVCacheEventBase):
    """The prefix cache was reset."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
