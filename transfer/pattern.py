"""Deterministic block contents and checksums, so a puller can verify every block it received.

`block_pattern(seed, i, n)` depends only on its arguments: the owner fills block `i` with it and
the puller recomputes it (or its xxh3 digest) without any extra round trip. It is one random
buffer per (seed, size) XOR-ed with a per-block 64-bit word (splitmix64 of the block id): cheap
enough to fill GiBs for the benchmark, and a block that lands in the wrong slot, arrives
partially, or is shifted never matches.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import numpy.typing as npt
import xxhash

from transfer.pool import KvBlockPool

_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


@lru_cache(maxsize=8)
def _base(seed: int, words: int) -> npt.NDArray[np.uint64]:
    base = np.random.default_rng(seed).integers(0, 2**63, size=words, dtype=np.uint64)
    base.setflags(write=False)
    return base


def block_pattern(seed: int, block_id: int, block_bytes: int) -> npt.NDArray[np.uint8]:
    """The bytes of block `block_id` (a fresh array)."""
    words = -(-block_bytes // 8)
    word = np.uint64(_splitmix64((seed << 32) ^ block_id))
    data: npt.NDArray[np.uint8] = np.bitwise_xor(_base(seed, words), word).view(np.uint8)
    return data[:block_bytes]


def fill_pool(pool: KvBlockPool, seed: int) -> None:
    """Write `block_pattern(seed, i, ...)` into every block of a host pool."""
    array = pool.blocks_array()
    for i in range(pool.num_blocks):
        array[i] = block_pattern(seed, i, pool.block_bytes)


def block_digest(block: npt.NDArray[np.uint8]) -> int:
    """xxh3-64 of one block (fast enough to check GB/s transfers)."""
    return xxhash.xxh3_64_intdigest(block.data)


def expected_digest(seed: int, block_id: int, block_bytes: int) -> int:
    return block_digest(block_pattern(seed, block_id, block_bytes))
