"""Which replicas hold which block keys, as one bitmask per key: the core of both KV indexes.

Each replica gets a bit (bits of removed replicas are reused). ``masks[key]`` is the OR of the
bits of the replicas holding ``key``. The longest-prefix match of a prompt's keys is then a
single walk over the keys::

    alive = all replica bits
    for i, key in enumerate(keys):
        new = alive & masks.get(key, 0)
        for each replica bit in alive & ~new: matched[replica] = i      # it drops out here
        alive = new
        if not alive: break
    for each replica bit still in alive: matched[replica] = len(keys)

Cost: O(number of keys walked x R/64) machine-word operations for R replicas (Python ints are
bit vectors), plus O(R) to report the drop-outs -- linear in the prompt's blocks, and the walk
stops at the first block no replica holds. ``match`` reports only replicas with >= 1 block.

Reporting a drop-out mask names its replicas by bit *index* (``bit_length``, a list lookup),
not by the power of two (hashing a 1,024-bit int per replica made the report grow as R^2:
issue 15's profile at 1,024 replicas); a mask with many bits is unpacked in one
``numpy.unpackbits`` instead of one big-int operation per bit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

# A mask with more set bits than this is unpacked with numpy (one C pass over its bytes);
# fewer are peeled off one by one (each peel is O(R/64) word operations).
_UNPACK_FROM_BITS = 24


class ReplicaBitmap:
    """Key -> set-of-replicas as bitmasks, with the prefix walk above. Not thread-safe."""

    __slots__ = ("_bit_of", "_free_bits", "_masks", "_name_at", "_next_bit", "_replica_of_bit")

    def __init__(self) -> None:
        self._masks: dict[int, int] = {}
        self._bit_of: dict[str, int] = {}
        self._replica_of_bit: dict[int, str] = {}
        self._free_bits: list[int] = []
        self._next_bit = 0
        self._name_at: list[str] = []  # bit index -> replica ("" when free)

    def bit(self, replica_id: str) -> int:
        """The replica's bit (a power of two), allocated on first use."""
        bit = self._bit_of.get(replica_id)
        if bit is None:
            index = self._free_bits.pop() if self._free_bits else self._next_bit
            if index == self._next_bit:
                self._next_bit += 1
            bit = 1 << index
            self._bit_of[replica_id] = bit
            self._replica_of_bit[bit] = replica_id
            names = self._name_at
            if index == len(names):
                names.append(replica_id)
            else:
                names[index] = replica_id
        return bit

    def release(self, replica_id: str, keys: Iterable[int]) -> None:
        """Clear the replica's bit on ``keys`` (the keys it holds) and free the bit for reuse."""
        bit = self._bit_of.pop(replica_id, None)
        if bit is None:
            return
        self.discard_many(bit, keys)
        del self._replica_of_bit[bit]
        index = bit.bit_length() - 1
        self._name_at[index] = ""
        self._free_bits.append(index)

    def add(self, bit: int, key: int) -> None:
        masks = self._masks
        masks[key] = masks.get(key, 0) | bit

    def discard(self, bit: int, key: int) -> None:
        masks = self._masks
        mask = masks.get(key)
        if mask is None:
            return
        mask &= ~bit
        if mask:
            masks[key] = mask
        else:
            del masks[key]

    def discard_many(self, bit: int, keys: Iterable[int]) -> None:
        for key in keys:
            self.discard(bit, key)

    def holders(self, key: int) -> list[str]:
        """Replicas holding ``key``."""
        return self._replicas_in(self._masks.get(key, 0))

    def has(self, replica_id: str, key: int) -> bool:
        bit = self._bit_of.get(replica_id)
        return bit is not None and bool(self._masks.get(key, 0) & bit)

    def __len__(self) -> int:
        """Distinct keys held by at least one replica."""
        return len(self._masks)

    def _replicas_in(self, mask: int) -> list[str]:
        names = self._name_at
        if mask.bit_count() > _UNPACK_FROM_BITS:
            raw = np.frombuffer(mask.to_bytes((mask.bit_length() + 7) // 8, "little"), np.uint8)
            return [
                names[i] for i in np.flatnonzero(np.unpackbits(raw, bitorder="little")).tolist()
            ]
        out: list[str] = []
        while mask:
            low = mask & -mask
            out.append(names[low.bit_length() - 1])
            mask ^= low
        return out

    def match(self, keys: Sequence[int]) -> dict[str, int]:
        """Leading keys of ``keys`` held by each replica (only replicas with >= 1)."""
        masks = self._masks
        matched: dict[str, int] = {}
        if not keys:
            return matched
        alive = masks.get(keys[0], 0)
        i = 1
        n = len(keys)
        while alive and i < n:
            new = alive & masks.get(keys[i], 0)
            if new != alive:
                for replica in self._replicas_in(alive & ~new):
                    matched[replica] = i
                alive = new
            i += 1
        for replica in self._replicas_in(alive):
            matched[replica] = n
        return matched
