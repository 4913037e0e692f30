"""pdorch's own block keys: an xxh3-64 chain over full blocks of token ids.

Why our own keys: engines hash blocks with an algorithm and seed of their own (vLLM:
``sha256_cbor``, ``xxhash``, a random per-process seed for the non-cryptographic ones...). The
router must hash a *new* prompt before it knows where it goes, so it cannot rely on reproducing
every engine's hash. Instead the KV index recomputes these keys from the ``token_ids`` each
``BlockStored`` event carries, and keeps a map from the engine's hashes to our keys for removals.

Formula (``block_size = B``, ``tokens`` the prompt's token ids, only *full* blocks count)::

    seed      = xxh3_64(b"pdorch-kv-v1" | field(model) | field(lora_name) | field(cache_salt))
    key[-1]   = seed
    key[i]    = xxh3_64(le_u32(tokens[i*B:(i+1)*B]), seed=key[i-1])     for i in 0..len//B-1

where ``field(None) = b"\\x00"`` and ``field(s) = b"\\x01" + len(utf8(s)) as u32 LE + utf8(s)``
(so ``None`` and ``""`` differ and no two field tuples collide by concatenation), ``le_u32``
packs the ids as unsigned 32-bit little-endian integers, and ``xxh3_64(data, seed=s)`` is
XXH3-64 with a 64-bit seed. A key therefore identifies the whole prefix up to and including its
block, and the LoRA adapter and cache salt -- which change every block hash in vLLM, because
vLLM puts them in the first block's extra keys and chains from there -- change every key here.

Costs: one ``array('I', ...)`` pack of the token list (~30-60 us per 8k tokens: the one pass
over Python ints; a numpy array of ids is one copy) and one xxh3 call per block over a slice of
the packed bytes (~0.2 us per 16-token block on one core; ~0.1 ms for an 8k-token prompt at
B = 16). With a :class:`~router.chain_memo.ChainMemo` (``memo=``, what ``KvIndex.keys_for``
passes) the blocks a recent prompt shares with this one are not hashed again.

Public API (stable): :class:`KeySeed`, :func:`block_keys`, :func:`seed_value`,
:func:`chain_keys`.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from xxhash import xxh3_64_intdigest

if TYPE_CHECKING:
    from router.chain_memo import ChainMemo

_TAG = b"pdorch-kv-v1"

if array("I").itemsize != 4:  # pragma: no cover - every supported platform has 4-byte uint
    raise ImportError("router.block_keys needs a 4-byte array('I')")


@dataclass(frozen=True, slots=True)
class KeySeed:
    """What, besides the tokens, makes a cached block reusable: model, LoRA adapter, cache salt.

    ``model`` is the name the fleet serves the base model under (one index per model);
    ``lora_name`` the adapter's name (vLLM: ``BlockStored.lora_name``); ``cache_salt`` the
    request's ``cache_salt`` (vLLM: the string in the first block's ``extra_keys``).
    """

    model: str
    lora_name: str | None = None
    cache_salt: str | None = None

    @property
    def value(self) -> int:
        """The 64-bit chain seed (``key[-1]`` in the module formula); cached per seed."""
        return seed_value(self.model, self.lora_name, self.cache_salt)


def _field(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    raw = value.encode("utf-8")
    return b"\x01" + len(raw).to_bytes(4, "little") + raw


@lru_cache(maxsize=4096)
def seed_value(model: str, lora_name: str | None = None, cache_salt: str | None = None) -> int:
    """``xxh3_64(tag | field(model) | field(lora_name) | field(cache_salt))`` (see module doc)."""
    return xxh3_64_intdigest(_TAG + _field(model) + _field(lora_name) + _field(cache_salt))


def _pack(token_ids: Sequence[int] | npt.NDArray[np.integer], n_tokens: int) -> bytes:
    if isinstance(token_ids, np.ndarray):
        return np.ascontiguousarray(token_ids[:n_tokens], dtype="<u4").tobytes()
    packed = array("I", token_ids[:n_tokens] if len(token_ids) != n_tokens else token_ids)
    if sys.byteorder == "big":  # pragma: no cover - keys must not depend on the host
        packed.byteswap()
    return packed.tobytes()


def block_keys(
    token_ids: Sequence[int] | npt.NDArray[np.integer],
    block_size: int,
    seed: KeySeed | int,
    *,
    parent: int | None = None,
    memo: ChainMemo | None = None,
) -> list[int]:
    """Keys of the full blocks of ``token_ids`` (a trailing partial block gets no key).

    ``seed`` is a :class:`KeySeed` or its :attr:`KeySeed.value`. ``parent``, when given, is the
    key of the block just before ``token_ids[0]`` and continues that chain instead of starting
    from the seed (the KV index uses it for ``BlockStored`` events whose parent it knows).
    ``memo`` (prompts only, not with ``parent``) reuses the keys of a prefix a recent prompt
    shared; the keys are the same. Token ids must fit in 32 bits (``OverflowError`` otherwise).
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    n_blocks = len(token_ids) // block_size
    if n_blocks == 0:
        return []
    buf = _pack(token_ids, n_blocks * block_size)
    seed_int = seed if isinstance(seed, int) else seed.value
    if parent is None and memo is not None:
        return memo.keys(buf, block_size, seed_int)
    key = parent if parent is not None else seed_int
    return chain_keys(buf, 0, block_size * 4, key, [])


def chain_keys(buf: bytes, start: int, step: int, key: int, keys: list[int]) -> list[int]:
    """Append to ``keys`` the keys of the ``step``-byte blocks of ``buf[start:]``, chained from
    ``key`` (the module formula's loop; ``step`` = block size · 4); returns ``keys``."""
    append = keys.append
    h = xxh3_64_intdigest
    for at in range(start, len(buf) - step + 1, step):
        key = h(buf[at : at + step], key)
        append(key)
    return keys
