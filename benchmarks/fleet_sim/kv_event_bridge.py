"""A simulated core's KV events as the router's `KvIndex` takes them.

The live coordinator gets these events over ZMQ in vLLM's wire format (`router/subscriber.py`
decodes them into `router.kv_events`); the fleet simulator has the engine's own structs
(`pools.sim.kv_events`) in hand, so it converts field by field instead of encoding and
decoding msgpack after every step.
"""

from __future__ import annotations

from pools.sim.kv_events import AllBlocksCleared as SimCleared
from pools.sim.kv_events import BlockRemoved as SimRemoved
from pools.sim.kv_events import BlockStored as SimStored
from pools.sim.kv_events import KVCacheEvent
from router.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent


def to_router_events(events: list[KVCacheEvent]) -> list[KvEvent]:
    """The same events, in order, as `router.kv_events` structs."""
    out: list[KvEvent] = []
    for e in events:
        if isinstance(e, SimStored):
            out.append(
                BlockStored(
                    block_hashes=list(e.block_hashes),
                    parent_block_hash=e.parent_block_hash,
                    token_ids=e.token_ids,
                    block_size=e.block_size,
                    lora_id=e.lora_id,
                    medium=e.medium,
                    lora_name=e.lora_name,
                    group_idx=e.group_idx,
                )
            )
        elif isinstance(e, SimRemoved):
            out.append(
                BlockRemoved(
                    block_hashes=list(e.block_hashes), medium=e.medium, group_idx=e.group_idx
                )
            )
        elif isinstance(e, SimCleared):
            out.append(AllBlocksCleared())
    return out
