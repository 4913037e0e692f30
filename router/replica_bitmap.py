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

:meth:`ReplicaBitmap.depths` is the walk for the request path (issue 15, router-walk): it
writes each drop-out's depth into one ``array('q')`` indexed by bit (one C store per drop-out,
no name, no dict entry per replica) and returns :class:`PrefixDepths`, which is a
``Mapping[str, int]`` (the dict ``match`` returns, built only when read as a mapping) and an
int64 array that `ColumnBuilder` gathers into candidate order with one numpy take. The walk
itself is a ``for`` loop over the keys with one dict lookup and one AND per block; the
common drop-out (one replica leaves at a block) costs ``bit_length`` and one store.
At 8k tokens x 256 replicas this cut ``match`` from ~160 to ~60 µs (min of 40, load ~6).
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TypeVar, overload

import numpy as np
import numpy.typing as npt

# A mask with more set bits than this is unpacked with numpy (one C pass over its bytes);
# fewer are peeled off one by one (each peel is O(R/64) word operations).
_UNPACK_FROM_BITS = 24
_ZERO = array("q", [0])
# Layout tokens are unique across bitmaps (a builder may see depths of two indexes).
_LAYOUT_TOKENS = itertools.count(1)


class BitLayout:
    """Which replica owns which bit index, frozen at one moment (a new one after any bit is
    allocated or released). ``token`` is unique per layout; ``width`` = bits in use or free."""

    __slots__ = ("index", "names", "token", "width")

    def __init__(self, names: Sequence[str]) -> None:
        self.token = next(_LAYOUT_TOKENS)
        self.names = tuple(names)  # bit index -> replica ("" when free)
        self.width = len(self.names)
        self.index = {name: i for i, name in enumerate(self.names) if name}

    def rows(self, replica_ids: Sequence[str]) -> npt.NDArray[np.intp]:
        """Bit index of each of ``replica_ids``; ``width`` (a slot that is always 0) for
        replicas without a bit."""
        get = self.index.get
        width = self.width
        return np.array([get(rid, width) for rid in replica_ids], dtype=np.intp)


_T = TypeVar("_T")


class PrefixDepths(Mapping[str, int]):
    """:meth:`ReplicaBitmap.depths`' answer: leading blocks per replica.

    As a mapping it equals ``ReplicaBitmap.match`` (replicas with >= 1 block). ``array`` is the
    depth by bit index, ``layout.width + 1`` long (the last slot is the 0 of replicas without a
    bit); ``layout.rows(ids)`` turns candidate ids into indexes for it (cache it per layout
    token: it changes only when replicas join or leave). Immutable once returned.
    """

    __slots__ = ("_by_bit", "_dict", "layout")

    def __init__(self, by_bit: array[int], layout: BitLayout) -> None:
        self._by_bit = by_bit
        self.layout = layout
        self._dict: dict[str, int] | None = None

    @property
    def array(self) -> npt.NDArray[np.int64]:
        view: npt.NDArray[np.int64] = np.frombuffer(self._by_bit, dtype=np.int64)
        view.flags.writeable = False
        return view

    def as_dict(self) -> dict[str, int]:
        found = self._dict
        if found is None:
            names = self.layout.names
            found = self._dict = {
                names[i]: depth for i, depth in enumerate(self._by_bit[:-1]) if depth
            }
        return found

    def __getitem__(self, replica_id: str) -> int:
        i = self.layout.index.get(replica_id)
        depth = 0 if i is None else self._by_bit[i]
        if not depth:
            raise KeyError(replica_id)
        return depth

    @overload
    def get(self, replica_id: str, /) -> int | None: ...

    @overload
    def get(self, replica_id: str, default: int, /) -> int: ...

    @overload
    def get(self, replica_id: str, default: _T, /) -> int | _T: ...

    def get(self, replica_id: str, default: _T | None = None, /) -> int | _T | None:
        # Mapping.get's contract (None when absent), without building the dict
        i = self.layout.index.get(replica_id)
        depth = 0 if i is None else self._by_bit[i]
        return depth if depth else default

    def __contains__(self, replica_id: object) -> bool:
        i = self.layout.index.get(replica_id) if isinstance(replica_id, str) else None
        return i is not None and bool(self._by_bit[i])

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())

    def __repr__(self) -> str:
        return f"PrefixDepths({self.as_dict()!r})"


class ReplicaBitmap:
    """Key -> set-of-replicas as bitmasks, with the prefix walk above. Not thread-safe."""

    __slots__ = (
        "_bit_of",
        "_free_bits",
        "_layout",
        "_masks",
        "_name_at",
        "_next_bit",
        "_replica_of_bit",
    )

    def __init__(self) -> None:
        self._masks: dict[int, int] = {}
        self._bit_of: dict[str, int] = {}
        self._replica_of_bit: dict[int, str] = {}
        self._free_bits: list[int] = []
        self._next_bit = 0
        self._name_at: list[str] = []  # bit index -> replica ("" when free)
        self._layout: BitLayout | None = None  # built on first use after a change

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
            self._layout = None
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
        self._layout = None

    def layout(self) -> BitLayout:
        """The current bit -> replica layout (shared until a bit is allocated or released)."""
        layout = self._layout
        if layout is None:
            layout = self._layout = BitLayout(self._name_at)
        return layout

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
        return self.depths(keys).as_dict()

    def depths(self, keys: Sequence[int]) -> PrefixDepths:
        """``match`` as :class:`PrefixDepths` (module docstring): the walk of the request path."""
        layout = self.layout()
        by_bit = _ZERO * (layout.width + 1)
        if not keys:
            return PrefixDepths(by_bit, layout)
        get = self._masks.get
        alive = get(keys[0], 0)
        if not alive:
            return PrefixDepths(by_bit, layout)
        i = 1
        for key in keys[1:] if len(keys) > 1 else ():
            mask = get(key, 0)
            # equal masks (the replicas holding this block are exactly those still matching:
            # the usual case, engines cache prefixes) cost one compare and no new int
            if mask != alive:
                new = alive & mask
                if new != alive:
                    gone = alive ^ new  # new is a subset of alive: the replicas dropping out
                    if gone.bit_count() == 1:
                        by_bit[gone.bit_length() - 1] = i
                    else:
                        _store(by_bit, gone, i)
                    alive = new
                    if not alive:
                        break
            i += 1
        else:
            _store(by_bit, alive, len(keys))
        return PrefixDepths(by_bit, layout)


def _store(by_bit: array[int], mask: int, depth: int) -> None:
    """``by_bit[i] = depth`` for every set bit ``i`` of ``mask``."""
    if mask.bit_count() > _UNPACK_FROM_BITS:
        raw = np.frombuffer(mask.to_bytes((mask.bit_length() + 7) // 8, "little"), np.uint8)
        view = np.frombuffer(by_bit, dtype=np.int64)
        view[np.flatnonzero(np.unpackbits(raw, bitorder="little"))] = depth
        return
    while mask:
        low = mask & -mask
        by_bit[low.bit_length() - 1] = depth
        mask ^= low
