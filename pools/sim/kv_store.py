"""The simulated engine's KV memory: real bytes whose content is a function of the token prefix.

Each block of the engine's paged pool is `block_bytes` of real memory (scaled down from the
model's true block size; 4 KiB by default) in a `transfer.KvBlockPool`, so P/D moves real bytes
over NIXL or TCP and the receiver can check every block.

Content rule: block `i` of a prompt holds its *content key* tiled over the block, where
`key_i = hash_block_tokens(key_{i-1}, tokens[i*B:(i+1)*B])` (`pools.sim.hashing`, sha256_cbor
chained exactly like vLLM's block hash; the last, partial block of a prompt is hashed over its
partial tokens). A full block's key is therefore its vLLM block hash (for requests without LoRA
or cache salt), and a block's bytes depend on every token before it: a block moved to the wrong
slot, from the wrong request, or torn by a failed transfer does not verify.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pools.sim.hashing import hash_block_tokens

DEFAULT_BLOCK_BYTES = 4096


def content_keys(
    prompt_token_ids: Sequence[int], block_size: int, num_blocks: int | None = None
) -> list[bytes]:
    """The content key of every block of the prompt, the trailing partial block included.

    With `num_blocks` beyond the prompt (a prefill leg that also generated tokens), the extra
    blocks chain on with no tokens, so owner and puller still agree on every block.
    """
    keys: list[bytes] = []
    parent: bytes | None = None
    for start in range(0, len(prompt_token_ids), block_size):
        parent = hash_block_tokens(parent, prompt_token_ids[start : start + block_size])
        keys.append(parent)
    while num_blocks is not None and len(keys) < num_blocks:
        parent = hash_block_tokens(parent, ())
        keys.append(parent)
    return keys if num_blocks is None else keys[:num_blocks]


def block_content(key: bytes, block_bytes: int) -> np.ndarray:
    """`key` tiled to `block_bytes` (one bytes multiplication and a zero-copy view)."""
    reps = -(-block_bytes // len(key))
    return np.frombuffer((key * reps)[:block_bytes], dtype=np.uint8)


class SimKvStore:
    """Writes and verifies block contents in a `(num_blocks, block_bytes)` uint8 array."""

    def __init__(self, blocks: np.ndarray, block_size: int) -> None:
        self.blocks = blocks
        self.block_size = block_size
        self.block_bytes = int(blocks.shape[1])

    def write(self, block_ids: Sequence[int], keys: Sequence[bytes]) -> None:
        for block_id, key in zip(block_ids, keys, strict=True):
            self.blocks[block_id] = block_content(key, self.block_bytes)

    def verify(self, block_ids: Sequence[int], keys: Sequence[bytes]) -> list[int]:
        """The block ids whose bytes differ from the expected content (empty when all match)."""
        return [
            block_id
            for block_id, key in zip(block_ids, keys, strict=True)
            if not np.array_equal(self.blocks[block_id], block_content(key, self.block_bytes))
        ]
