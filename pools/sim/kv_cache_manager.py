"""The KV-cache manager: a request's blocks over the `BlockPool` (vLLM v1's `KVCacheManager`).

Owns the block pool and everything a request does with blocks: the prefix lookup (longest chain
of cached full blocks), allocation of new blocks, caching of newly full blocks (hash -> block,
`BlockStored`), freeing (evictable again, in vLLM's order) and the prefix-cache counters. The
`Scheduler` decides *when* (admission, preemption, finish); this module does *what* happens to
the blocks, so the order of block operations (and so of KV events and evictions) is the one
place that keeps parity with vLLM (`tests/pools/sim/test_vllm_scheduler_parity.py`).

Pure: no clock; every method is O(blocks touched).
"""

from __future__ import annotations

from collections.abc import Sequence

from pools.sim.block_pool import BlockPool, KVCacheBlock
from pools.sim.config import EngineConfig
from pools.sim.kv_events import KVCacheEvent
from pools.sim.request import Request
from pools.sim.stats import EngineCounters


class KVCacheManager:
    """Blocks of every request of one engine; see the module docstring."""

    def __init__(self, config: EngineConfig, num_gpu_blocks: int, counters: EngineCounters) -> None:
        self.block_size = config.block_size
        self.enable_caching = config.enable_prefix_caching
        self.kv_connector = config.kv_connector
        self.counters = counters
        self.block_pool = BlockPool(
            num_gpu_blocks,
            enable_caching=config.enable_prefix_caching,
            enable_kv_cache_events=config.enable_kv_cache_events and config.enable_prefix_caching,
        )

    # ------------------------------------------------------------------ lookup
    def get_computed_blocks(self, r: Request) -> list[KVCacheBlock]:
        """The longest chain of cached full blocks of `r`, capped so its last token is always
        computed (`(num_tokens - 1) // block_size` blocks at most); [] without caching."""
        if not self.enable_caching:
            return []
        max_blocks = (r.num_tokens - 1) // self.block_size
        hashes = r.block_hashes
        if max_blocks > len(hashes):
            max_blocks = len(hashes)
        get = self.block_pool.cached_block_hash_to_block.get
        hit: list[KVCacheBlock] = []
        for i in range(max_blocks):
            entry = get(hashes[i])
            if not entry:
                break
            hit.append(next(iter(entry.values())))
        return hit

    def record_prefix_stats(self, r: Request, num_local: int, num_ext: int) -> None:
        """Count an admitted request's lookup: new requests in `prefix_cache_*` (and, with a KV
        connector, `external_prefix_cache_*`), preempted ones apart (vLLM keeps them out)."""
        c = self.counters
        if r.num_preemptions > 0:
            c.preempted_prefix_cache_queries += r.num_tokens
            c.preempted_prefix_cache_hits += num_local
        else:
            c.prefix_cache_queries += r.num_tokens
            c.prefix_cache_hits += num_local
        if self.kv_connector and r.num_preemptions == 0:
            c.external_prefix_cache_queries += r.num_tokens - num_local
            c.external_prefix_cache_hits += num_ext

    # ------------------------------------------------------------------ allocation
    def num_free_blocks(self) -> int:
        return self.block_pool.free_block_queue.num_free_blocks

    def free_blocks_after_hit(self, hit_blocks: Sequence[KVCacheBlock]) -> int:
        """Free blocks left once `hit_blocks` are taken (a hit block with no reference is in
        the free queue, so touching it uses one free block)."""
        return self.block_pool.get_num_free_blocks() - sum(1 for b in hit_blocks if b.ref_cnt == 0)

    def allocate_slots(self, r: Request, hit_blocks: list[KVCacheBlock], num_new: int) -> None:
        """Give `r` its prefix-hit blocks (referenced, out of the free queue) and `num_new` new
        blocks; the caller checked they fit."""
        if hit_blocks:
            self.block_pool.touch(hit_blocks)
            r.blocks.extend(hit_blocks)
            r.num_cached_blocks = len(hit_blocks)
        if num_new > 0:
            r.blocks.extend(self.block_pool.get_new_blocks(num_new))

    def allocate_new_blocks(self, r: Request, num_new: int) -> None:
        r.blocks.extend(self.block_pool.get_new_blocks(num_new))

    def cache_blocks(self, r: Request, num_tokens: int) -> None:
        """Cache r's full blocks covering its first `num_tokens` tokens (capped at known ones)."""
        if not self.enable_caching:
            return
        n_full = num_tokens // self.block_size
        if n_full > len(r.block_hashes):
            n_full = len(r.block_hashes)
        if n_full > r.num_cached_blocks:
            sim = r.sim
            self.block_pool.cache_full_blocks(
                r.blocks,
                r.block_hashes,
                r.num_cached_blocks,
                n_full,
                self.block_size,
                r.all_token_ids,
                r.hasher,
                lora_id=sim.lora_id,
                lora_name=sim.lora_name,
            )
            r.num_cached_blocks = n_full

    def apply_block_ops(
        self, running: Sequence[Request], ops: Sequence[tuple[int, int, int]]
    ) -> None:
        """Run a decode stretch's block operations in plan order (`decode_stretch.BlockOp`:
        step j, running index i, 0 = allocate one block / 1 = cache up to token j + 1 of the
        stretch), before the requests' computed tokens advance."""
        for j, i, kind in ops:
            r = running[i]
            if kind == 0:
                r.blocks.extend(self.block_pool.get_new_blocks(1))
            else:
                self.cache_blocks(r, r.num_computed_tokens + j + 1)

    # ------------------------------------------------------------------ freeing
    def free(self, r: Request) -> None:
        """Free all of r's blocks, tail first (vLLM: the tail is evicted first), and forget
        which were cached."""
        if r.blocks:
            self.block_pool.free_blocks(list(reversed(r.blocks)))
        r.blocks = []
        r.num_cached_blocks = 0

    def free_blocks(self, ordered: Sequence[KVCacheBlock]) -> None:
        """Free blocks no request owns any more (held blocks whose lease ended), in this order."""
        self.block_pool.free_blocks(ordered)

    def blocks_by_id(self, block_ids: Sequence[int]) -> list[KVCacheBlock]:
        blocks = self.block_pool.blocks
        return [blocks[i] for i in block_ids]

    # ------------------------------------------------------------------ cache-wide
    def reset_prefix_cache(self, requests: Sequence[Request]) -> bool:
        """Drop every cached hash (AllBlocksCleared); False while blocks are in use (vLLM)."""
        ok = self.block_pool.reset_prefix_cache()
        if ok:
            for r in requests:
                r.num_cached_blocks = 0
        return ok

    def usage(self) -> float:
        return self.block_pool.get_usage()

    def take_events(self) -> list[KVCacheEvent]:
        return self.block_pool.take_events()
