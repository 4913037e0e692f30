"""BlockPool: vLLM v1's free queue / prefix cache / ref counts / event semantics."""

from __future__ import annotations

import pytest

from pools.sim.block_pool import BlockPool, KVCacheBlock
from pools.sim.hashing import BlockHasher, request_block_hashes, to_external_hash
from pools.sim.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

BS = 4


def _cache(pool: BlockPool, blocks: list[KVCacheBlock], toks: list[int]) -> list[bytes]:
    hashes = request_block_hashes(toks, BS)
    pool.cache_full_blocks(blocks, hashes, 0, len(hashes), BS, toks, BlockHasher(BS))
    return hashes


def test_null_block_reserved_and_usage() -> None:
    pool = BlockPool(5)
    assert pool.get_num_free_blocks() == 4
    assert pool.get_usage() == 0.0
    got = pool.get_new_blocks(2)
    assert [b.block_id for b in got] == [1, 2]
    assert all(b.ref_cnt == 1 for b in got)
    assert pool.get_usage() == 0.5
    with pytest.raises(ValueError):
        pool.get_new_blocks(3)


def test_free_order_uncached_first_cached_last() -> None:
    pool = BlockPool(7)
    a = pool.get_new_blocks(3)  # 1,2,3
    toks = list(range(8))
    _cache(pool, a[:2], toks)  # blocks 1,2 cached, 3 not
    pool.free_blocks(list(reversed(a)))
    # uncached block 3 goes to the front, cached 2 then 1 to the back (tail-first free)
    assert pool.free_block_queue.block_ids() == [3, 4, 5, 6, 2, 1]


def test_cached_block_stays_hit_until_reused_then_removed_event() -> None:
    pool = BlockPool(4)  # 3 usable
    blocks = pool.get_new_blocks(2)
    toks = list(range(8))
    hashes = _cache(pool, blocks, toks)
    stored = pool.take_events()
    assert len(stored) == 1 and isinstance(stored[0], BlockStored)
    assert stored[0].block_hashes == [to_external_hash(h) for h in hashes]
    assert stored[0].parent_block_hash is None
    assert stored[0].token_ids == toks
    assert stored[0].extra_keys == [None, None]
    pool.free_blocks(list(reversed(blocks)))
    assert pool.get_num_free_blocks() == 3
    # still a prefix hit while free (evicted only when needed)
    hit = pool.get_cached_block(hashes[0])
    assert hit is blocks[0]
    pool.touch([hit])
    assert hit.ref_cnt == 1 and pool.get_num_free_blocks() == 2
    pool.free_blocks([hit])
    assert pool.take_events() == []
    # need 3 blocks: the uncached one first, then the LRU cached ones (tail block 2 freed first)
    got = pool.get_new_blocks(3)
    assert [b.block_id for b in got] == [3, 2, 1]
    removed = pool.take_events()
    assert [type(e) for e in removed] == [BlockRemoved, BlockRemoved]
    assert [e.block_hashes for e in removed if isinstance(e, BlockRemoved)] == [
        [to_external_hash(hashes[1])],
        [to_external_hash(hashes[0])],
    ]
    assert pool.get_cached_block(hashes[0]) is None


def test_ref_counts_shared_block() -> None:
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(1)
    hashes = _cache(pool, blocks, [1, 2, 3, 4])
    pool.touch(blocks)  # a second request hits it
    assert blocks[0].ref_cnt == 2
    pool.free_blocks(blocks)
    assert blocks[0].ref_cnt == 1 and pool.get_num_free_blocks() == 2
    pool.free_blocks(blocks)
    assert pool.get_num_free_blocks() == 3
    assert pool.get_cached_block(hashes[0]) is blocks[0]


def test_chained_event_has_parent() -> None:
    pool = BlockPool(8)
    blocks = pool.get_new_blocks(3)
    toks = list(range(12))
    hashes = request_block_hashes(toks, BS)
    hasher = BlockHasher(BS)
    pool.cache_full_blocks(blocks, hashes, 0, 1, BS, toks, hasher)
    pool.cache_full_blocks(blocks, hashes, 1, 3, BS, toks, hasher)
    _, e2 = pool.take_events()
    assert isinstance(e2, BlockStored)
    assert e2.parent_block_hash == to_external_hash(hashes[0])
    assert e2.token_ids == toks[4:12]


def test_reset_prefix_cache() -> None:
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(1)
    hashes = _cache(pool, blocks, [1, 2, 3, 4])
    pool.take_events()
    assert pool.reset_prefix_cache() is False  # in use
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(hashes[0]) is None
    assert [type(e) for e in pool.take_events()] == [AllBlocksCleared]
