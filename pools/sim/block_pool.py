"""A paged KV block pool with prefix caching, shaped like vLLM v1's `BlockPool`.

Same names and the same behaviour as `vllm/v1/core/block_pool.py` (read, not copied), so the
conformance suite has an obvious mapping and a vLLM engineer feels at home:

- `blocks[0]` is the *null block*: never handed out, never freed (vLLM reserves it too), so a
  pool of `num_gpu_blocks` has `num_gpu_blocks - 1` usable blocks and `get_usage()` divides by
  that.
- The free queue holds every block with `ref_cnt == 0` in *eviction order*: `get_new_blocks`
  takes from the front. `free_blocks` puts blocks without a hash at the front (reused first)
  and cached blocks at the back (kept longest: LRU). A cached block in the free queue is still
  a prefix-cache hit until it is reused; only then is its hash dropped (`BlockRemoved`).
- `touch` takes a hit block out of the free queue and bumps its ref count.
- `cached_block_hash_to_block` maps a block hash to the block(s) holding it; duplicates are
  allowed (vLLM never de-duplicates, so block tables stay append-only).
- Events are queued exactly where state changes: `BlockStored` in `cache_full_blocks`,
  `BlockRemoved` when a cached block is reused for new content, `AllBlocksCleared` on a successful
  `reset_prefix_cache`.

The free queue is an `OrderedDict` (C-implemented, O(1) pop-front / append / prepend / remove)
instead of vLLM's hand-made doubly linked list.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from pools.sim.hashing import BlockHasher, event_extra_keys, to_external_hash
from pools.sim.kv_events import (
    FULL_ATTENTION,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)


class KVCacheBlock:
    """One KV block's metadata: id, how many requests use it, and its hash once full+cached."""

    __slots__ = ("block_hash", "block_id", "is_null", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.is_null = False

    def __repr__(self) -> str:
        cached = self.block_hash is not None
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, cached={cached})"


class FreeKVCacheBlockQueue:
    """Blocks with ref_cnt 0, front = next to be reused (evicted)."""

    __slots__ = ("_q",)

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self._q: OrderedDict[int, KVCacheBlock] = OrderedDict((b.block_id, b) for b in blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._q)

    def popleft(self) -> KVCacheBlock:
        return self._q.popitem(last=False)[1]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        pop = self._q.popitem
        return [pop(last=False)[1] for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        del self._q[block.block_id]

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        q = self._q
        for b in blocks:
            q[b.block_id] = b

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put `blocks` at the front, keeping their order (blocks[0] becomes the front)."""
        q = self._q
        for b in reversed(blocks):
            q[b.block_id] = b
            q.move_to_end(b.block_id, last=False)

    def block_ids(self) -> list[int]:
        """Front-to-back ids (eviction order); for tests and debugging."""
        return list(self._q)


class BlockPool:
    """See the module docstring. `num_gpu_blocks` includes the null block (as in vLLM)."""

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool = True,
        enable_kv_cache_events: bool = True,
        medium: str = MEDIUM_GPU,
    ) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(
                f"num_gpu_blocks must be >= 2 (one is the null block), got {num_gpu_blocks}"
            )
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.medium = medium
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.cached_block_hash_to_block: dict[bytes, dict[int, KVCacheBlock]] = {}
        self.kv_event_queue: list[KVCacheEvent] = []

    # -- lookup ---------------------------------------------------------------------------
    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        """Any block holding `block_hash` (the first one cached), or None."""
        blocks = self.cached_block_hash_to_block.get(block_hash)
        if not blocks:
            return None
        return next(iter(blocks.values()))

    # -- caching --------------------------------------------------------------------------
    def cache_full_blocks(
        self,
        blocks: Sequence[KVCacheBlock],
        block_hashes: Sequence[bytes],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        all_token_ids: Sequence[int],
        hasher: BlockHasher,
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> None:
        """Register blocks[num_cached_blocks:num_full_blocks] (now full) in the prefix cache and
        queue one `BlockStored` for them, chained on the hash of block num_cached_blocks - 1."""
        if num_cached_blocks >= num_full_blocks:
            return
        cache = self.cached_block_hash_to_block
        new_hashes: list[int] = []
        for i in range(num_cached_blocks, num_full_blocks):
            blk = blocks[i]
            if blk.is_null:
                continue
            h = block_hashes[i]
            if blk.block_hash is None:
                blk.block_hash = h
                entry = cache.get(h)
                if entry is None:
                    cache[h] = {blk.block_id: blk}
                else:
                    entry[blk.block_id] = blk
            new_hashes.append(to_external_hash(h))
        if not self.enable_kv_cache_events:
            return
        parent = (
            to_external_hash(block_hashes[num_cached_blocks - 1]) if num_cached_blocks else None
        )
        self.kv_event_queue.append(
            BlockStored(
                block_hashes=new_hashes,
                parent_block_hash=parent,
                token_ids=list(
                    all_token_ids[num_cached_blocks * block_size : num_full_blocks * block_size]
                ),
                block_size=block_size,
                lora_id=lora_id,
                medium=self.medium,
                lora_name=lora_name,
                extra_keys=[
                    event_extra_keys(hasher.extra_keys(i))
                    for i in range(num_cached_blocks, num_full_blocks)
                ],
                group_idx=0,
                kv_cache_spec_kind=FULL_ATTENTION,
            )
        )

    # -- allocation -----------------------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take `num_blocks` from the front of the free queue, evicting their cached hashes."""
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = self.free_block_queue.popleft_n(num_blocks)
        for block in ret:
            if block.block_hash is not None:
                self._evict_cached_block(block)
            block.ref_cnt += 1
        return ret

    def _evict_cached_block(self, block: KVCacheBlock) -> None:
        h = block.block_hash
        assert h is not None
        block.block_hash = None
        entry = self.cached_block_hash_to_block.get(h)
        if entry is None or entry.pop(block.block_id, None) is None:
            return
        if not entry:
            del self.cached_block_hash_to_block[h]
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(
                BlockRemoved(block_hashes=[to_external_hash(h)], medium=self.medium, group_idx=0)
            )

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """A prefix hit: take the blocks out of the free queue (if there) and count the user."""
        q = self.free_block_queue
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                q.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; blocks reaching 0 go back to the free queue.

        `ordered_blocks` is in eviction priority (first = evicted first): the core passes a
        request's blocks tail-first, so a prompt's shared head survives longest.
        """
        evict_first: list[KVCacheBlock] = []
        evict_last: list[KVCacheBlock] = []
        caching = self.enable_caching
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                if block.block_hash is None or not caching:
                    evict_first.append(block)
                else:
                    evict_last.append(block)
        if evict_first:
            self.free_block_queue.prepend_n(evict_first)
        if evict_last:
            self.free_block_queue.append_n(evict_last)

    # -- maintenance ----------------------------------------------------------------------
    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is in use, as in vLLM."""
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:
            return False
        self.cached_block_hash_to_block = {}
        for block in self.blocks:
            block.block_hash = None
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of usable blocks in use (0..1), vLLM's `kv_cache_usage_perc`."""
        total = self.num_gpu_blocks - 1
        return 1.0 - self.get_num_free_blocks() / total

    def take_events(self) -> list[KVCacheEvent]:
        events = self.kv_event_queue
        self.kv_event_queue = []
        return events
