"""Prefix-cache block hashing exactly as vLLM v1 does it (`--prefix-caching-hash-algo sha256_cbor`).

Why exact: the router reproduces engine hashes from `BlockStored` events, and the conformance
suite checks the simulated engine's hashes against real vLLM's. The rules (vLLM 0.32,
`vllm/v1/core/kv_cache_utils.py`, `vllm/utils/hashing.py`):

- `sha256_cbor(x) = sha256(cbor2.dumps(x, canonical=True))`.
- `NONE_HASH = sha256_cbor(seed)`, seed = `$PYTHONHASHSEED` if set, else `"vllm-none-hash"`.
- block i (full blocks only): `h_i = sha256_cbor((h_{i-1} or NONE_HASH, tuple(tokens_i), extra_i))`.
- `extra_i` is None, or a tuple of *tagged* keys in this order: `("lora", name, path)` on every
  block of a LoRA request, then `("cache_salt", salt)` on block 0 only.
- events carry the low 64 bits of the digest (`int.from_bytes(h, "big") & (2**64 - 1)`) and the
  extra keys *untagged* (`key[1]`: the LoRA name, the salt).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

import cbor2

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
_MASK64 = (1 << 64) - 1


def sha256_cbor(obj: Any) -> bytes:
    """SHA-256 over canonical CBOR: language-independent, so non-Python engines agree."""
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def none_hash_seed() -> str:
    """`$PYTHONHASHSEED` wins (vLLM's rule), else the fixed seed shared by all sha256 engines."""
    return os.environ.get("PYTHONHASHSEED", DEFAULT_NONE_HASH_SEED)


NONE_HASH: bytes = sha256_cbor(none_hash_seed())

ExtraKeys = tuple[Any, ...] | None


def hash_block_tokens(
    parent_block_hash: bytes | None,
    token_ids: Sequence[int],
    extra_keys: ExtraKeys = None,
) -> bytes:
    """Hash of one full block chained on its parent's hash (None/empty → NONE_HASH)."""
    parent = parent_block_hash if parent_block_hash else NONE_HASH
    return sha256_cbor((parent, tuple(token_ids), extra_keys))


def block_extra_keys(
    start_token_idx: int,
    *,
    lora_name: str | None = None,
    lora_path: str | None = None,
    cache_salt: str | None = None,
) -> ExtraKeys:
    """The tagged extra keys that enter the hash of the block starting at `start_token_idx`."""
    keys: list[tuple[Any, ...]] = []
    if lora_name:
        keys.append(("lora", lora_name, lora_path))
    if cache_salt and start_token_idx == 0:
        keys.append(("cache_salt", cache_salt))
    return tuple(keys) if keys else None


def event_extra_keys(extra_keys: ExtraKeys) -> tuple[Any, ...] | None:
    """The untagged form `BlockStored.extra_keys` carries for one block (vLLM's
    `to_event_extra_keys`): each tagged key becomes its value (`key[1]`)."""
    if extra_keys is None:
        return None
    return tuple(key[1:] if key[0] == "mm" else key[1] for key in extra_keys)


def to_external_hash(block_hash: bytes) -> int:
    """The 64-bit integer events carry for a block hash."""
    return int.from_bytes(block_hash, "big") & _MASK64


class BlockHasher:
    """Incremental hasher for one request: hashes each block once, the moment it becomes full.

    The core calls `extend` after the prompt is known and whenever output tokens are appended;
    the cost is one sha256 per `block_size` tokens, never a rescan of the sequence.
    """

    __slots__ = ("_first_extra", "_rest_extra", "block_size")

    def __init__(
        self,
        block_size: int,
        *,
        lora_name: str | None = None,
        lora_path: str | None = None,
        cache_salt: str | None = None,
    ) -> None:
        self.block_size = block_size
        self._first_extra = block_extra_keys(
            0, lora_name=lora_name, lora_path=lora_path, cache_salt=cache_salt
        )
        self._rest_extra = block_extra_keys(
            block_size, lora_name=lora_name, lora_path=lora_path, cache_salt=cache_salt
        )

    def extra_keys(self, block_index: int) -> ExtraKeys:
        return self._first_extra if block_index == 0 else self._rest_extra

    def extend(self, all_token_ids: Sequence[int], hashes: list[bytes]) -> None:
        """Append to `hashes` the hash of every block of `all_token_ids` that is full and not
        hashed yet."""
        bs = self.block_size
        i = len(hashes)
        n_full = len(all_token_ids) // bs
        parent = hashes[-1] if hashes else None
        while i < n_full:
            start = i * bs
            parent = hash_block_tokens(
                parent, all_token_ids[start : start + bs], self.extra_keys(i)
            )
            hashes.append(parent)
            i += 1


def request_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    lora_name: str | None = None,
    lora_path: str | None = None,
    cache_salt: str | None = None,
) -> list[bytes]:
    """Hashes of all full blocks of `token_ids` (what vLLM's request block hasher computes)."""
    hashes: list[bytes] = []
    BlockHasher(block_size, lora_name=lora_name, lora_path=lora_path, cache_salt=cache_salt).extend(
        token_ids, hashes
    )
    return hashes
