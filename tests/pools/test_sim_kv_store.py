"""Block contents are a function of the token prefix, and verification catches damage."""

from __future__ import annotations

import numpy as np

from pools.sim.hashing import request_block_hashes
from pools.sim.kv_store import SimKvStore, block_content, content_keys


def test_full_block_keys_are_the_vllm_block_hashes() -> None:
    tokens = list(range(1000, 1100))  # 3 full blocks of 32 + a partial one
    keys = content_keys(tokens, 32)
    assert len(keys) == 4
    assert keys[:3] == request_block_hashes(tokens, 32)
    assert content_keys(tokens, 32, 6)[:4] == keys
    assert len(set(content_keys(tokens, 32, 6))) == 6


def test_content_depends_on_every_earlier_token() -> None:
    a = content_keys(list(range(64)), 32)
    b = content_keys([1, *range(1, 64)], 32)
    assert a[1] != b[1]  # block 1 is identical, but its prefix is not


def test_verify_reports_exactly_the_damaged_blocks() -> None:
    store = SimKvStore(np.zeros((8, 4096), dtype=np.uint8), block_size=32)
    keys = content_keys(list(range(200)), 32)
    ids = [1, 2, 3, 4, 5, 6, 7]
    store.write(ids, keys)
    assert store.verify(ids, keys) == []
    store.blocks[4, 4095] ^= 1
    assert store.verify(ids, keys) == [4]
    assert np.array_equal(store.blocks[1], block_content(keys[0], 4096))
