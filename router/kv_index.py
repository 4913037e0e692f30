"""The precise KV index: which replica holds which prompt blocks, built from KV events.

Keys are pdorch's own block keys (:mod:`router.block_keys`), recomputed from the ``token_ids``
of each ``BlockStored`` event, so the index works whatever hash algorithm or seed an engine
uses. Per replica it keeps ``engine hash -> own key`` so that ``BlockRemoved`` (which carries
only engine hashes) can be applied.

How an event's blocks get their keys (``B`` = the index's block size):

* ``parent_block_hash is None`` -- the chain starts a prompt: seed =
  ``KeySeed(model, event.lora_name, cache_salt)`` where ``cache_salt`` is the string in
  ``extra_keys[0]`` (vLLM publishes extra keys untagged: the LoRA name first when
  ``lora_name`` is set, then the salt on the prompt's first block only).
* otherwise -- the chain continues from the parent's own key (looked up in this replica's
  ``engine hash -> own key`` map). Seed, LoRA and salt are already folded into that key, which
  is why vLLM puts the salt on the first block only and still separates salted chains.
  A parent this replica's map does not know (events missed, parent evicted in between) makes
  the event's blocks *orphans*: they are counted and not indexed (they could never extend a
  match that starts at the prompt's first block anyway).

Blocks are skipped (counted in ``skipped_blocks``) when the event's ``block_size`` differs from
the index's, its ``medium`` is not in ``media`` (default: ``"GPU"`` or unset -- offloaded CPU
copies are another tier), its ``group_idx`` is not 0/unset (other KV-cache groups of hybrid
models), or a block's extra keys carry multimodal/prompt-embeds entries (their identity is
not in the token ids; this block and the rest of the event's chain are skipped).

Semantics:

* duplicates are idempotent (the same engine hash stored twice is one entry);
* ``AllBlocksCleared`` and :meth:`KvIndex.clear_replica` drop all of one replica's entries;
  :meth:`KvIndex.remove_replica` also forgets the replica;
* memory bound: at most ``max_blocks_per_replica`` entries per replica (default 262,144 --
  about 4.2M tokens at B = 16, above an 80 GB GPU's KV pool for 8B-class models). Past the cap
  the replica's *oldest-stored* entries are dropped first (a re-stored block counts as new);
  counted in ``cap_evictions``. Each entry costs roughly 200-250 bytes (two dict slots, an
  ``OrderedDict`` node and a shared bitmask slot), i.e. ~60 MB per full replica.
* :meth:`KvIndex.match` returns, per replica holding at least the first block, the number of
  *leading* blocks of the prompt it holds -- O(blocks x replicas/64) word operations
  (:mod:`router.replica_bitmap`).
  :meth:`KvIndex.overlap` is the same answer as a ``PrefixDepths`` (one array by replica bit,
  what the request path reads). :meth:`KvIndex.keys_for` reuses recent prompts' chains for
  the prefix they share (``chains``, a :class:`~router.chain_memo.ChainMemo` bounded by
  ``chain_memo_tokens``, default 1,048,576 tokens, ~7 MB; 0: off); the keys are the same.

Token-free mode (``engine_hash_keys=True``, additive, for the fleet simulator's token-free
engines): a ``BlockStored`` without ``token_ids`` is keyed by the engine's own int hashes (they
already chain over the prefix); requests are then matched with those same hashes.

Not thread-safe: one asyncio loop owns it (the subscriber and the router share that loop).

Public API (stable): :class:`KvIndex` (``apply``, ``apply_batch``, ``match``, ``overlap``,
``keys_for``,
``clear_replica``, ``remove_replica``, ``has_block``, ``blocks``, ``replicas``, ``stats``,
``counters``), :class:`KvIndexCounters`, :class:`KvIndexStats`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from router.block_keys import block_keys, seed_value
from router.chain_memo import DEFAULT_MAX_TOKENS, ChainMemo
from router.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineBlockHash,
    KvEvent,
    KvEventBatch,
)
from router.replica_bitmap import PrefixDepths, ReplicaBitmap

DEFAULT_MAX_BLOCKS_PER_REPLICA = 262_144


@dataclass(slots=True)
class KvIndexCounters:
    """Monotonic counters (for metrics); summed over replicas."""

    events: int = 0
    blocks_stored: int = 0
    blocks_removed: int = 0
    duplicate_blocks: int = 0
    removed_unknown: int = 0
    orphan_blocks: int = 0
    skipped_blocks: int = 0
    cap_evictions: int = 0
    clears: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class KvIndexStats:
    """A snapshot: blocks per replica, distinct keys, and the counters."""

    blocks_per_replica: dict[str, int]
    distinct_keys: int
    counters: dict[str, int] = field(default_factory=dict)


class _Replica:
    __slots__ = ("bit", "by_engine", "refs")

    def __init__(self, bit: int) -> None:
        self.bit = bit
        self.by_engine: OrderedDict[EngineBlockHash, int] = OrderedDict()
        self.refs: dict[int, int] = {}


class KvIndex:
    """Precise prefix index of one model (one block size) across replicas; see module doc."""

    def __init__(
        self,
        model: str,
        block_size: int,
        *,
        max_blocks_per_replica: int = DEFAULT_MAX_BLOCKS_PER_REPLICA,
        media: Sequence[str | None] = ("GPU", None),
        engine_hash_keys: bool = False,
        chain_memo_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if max_blocks_per_replica <= 0:
            raise ValueError("max_blocks_per_replica must be positive")
        self.model = model
        self.block_size = block_size
        self.max_blocks_per_replica = max_blocks_per_replica
        self.media = frozenset(media)
        self.engine_hash_keys = engine_hash_keys
        self.counters = KvIndexCounters()
        self._bitmap = ReplicaBitmap()
        self._replicas: dict[str, _Replica] = {}
        self.chains = ChainMemo(max_tokens=chain_memo_tokens)

    # -- queries -------------------------------------------------------------------------

    def keys_for(
        self,
        token_ids: Sequence[int] | npt.NDArray[np.integer],
        lora_name: str | None = None,
        cache_salt: str | None = None,
    ) -> list[int]:
        """A prompt's block keys for this index (its model and block size); the blocks a recent
        prompt shared are taken from ``chains`` (:mod:`router.chain_memo`), not hashed again."""
        seed = seed_value(self.model, lora_name, cache_salt)
        return block_keys(token_ids, self.block_size, seed, memo=self.chains)

    def match(self, keys: Sequence[int]) -> dict[str, int]:
        """Leading blocks of ``keys`` cached per replica; replicas with 0 are absent."""
        return self._bitmap.match(keys)

    def overlap(self, keys: Sequence[int]) -> PrefixDepths:
        """``match`` as :class:`~router.replica_bitmap.PrefixDepths`: the same mapping, plus the
        depths as one array by replica bit (what `ColumnBuilder` reads; the request path)."""
        return self._bitmap.depths(keys)

    def has_block(self, replica_id: str, key: int) -> bool:
        return self._bitmap.has(replica_id, key)

    def holders(self, key: int) -> list[str]:
        return self._bitmap.holders(key)

    def blocks(self, replica_id: str) -> int:
        """Entries (engine blocks) held for ``replica_id``."""
        rep = self._replicas.get(replica_id)
        return 0 if rep is None else len(rep.by_engine)

    def replicas(self) -> list[str]:
        return list(self._replicas)

    def stats(self) -> KvIndexStats:
        return KvIndexStats(
            {rid: len(rep.by_engine) for rid, rep in self._replicas.items()},
            len(self._bitmap),
            self.counters.as_dict(),
        )

    # -- updates -------------------------------------------------------------------------

    def apply_batch(self, replica_id: str, batch: KvEventBatch) -> None:
        self.apply(replica_id, batch.events)

    def apply(self, replica_id: str, events: Iterable[KvEvent]) -> None:
        """Apply one replica's events, in order."""
        rep = self._replica(replica_id)
        for event in events:
            self.counters.events += 1
            if isinstance(event, BlockStored):
                self._store(rep, event)
            elif isinstance(event, BlockRemoved):
                self._remove(rep, event)
            elif isinstance(event, AllBlocksCleared):
                self.counters.clears += 1
                self._clear(rep)

    def clear_replica(self, replica_id: str) -> int:
        """Drop all entries of ``replica_id`` (it stays known); returns how many."""
        rep = self._replicas.get(replica_id)
        return 0 if rep is None else self._clear(rep)

    def remove_replica(self, replica_id: str) -> int:
        """Forget ``replica_id`` and its entries; returns how many entries were dropped."""
        rep = self._replicas.pop(replica_id, None)
        if rep is None:
            return 0
        dropped = len(rep.by_engine)
        self._bitmap.release(replica_id, rep.refs)
        return dropped

    # -- internals -----------------------------------------------------------------------

    def _replica(self, replica_id: str) -> _Replica:
        rep = self._replicas.get(replica_id)
        if rep is None:
            rep = _Replica(self._bitmap.bit(replica_id))
            self._replicas[replica_id] = rep
        return rep

    def _clear(self, rep: _Replica) -> int:
        dropped = len(rep.by_engine)
        self._bitmap.discard_many(rep.bit, rep.refs)
        rep.by_engine.clear()
        rep.refs.clear()
        return dropped

    def _indexable_blocks(self, event: BlockStored) -> tuple[int, str | None]:
        """How many leading blocks of ``event`` can be keyed, and the chain's cache salt."""
        n = len(event.block_hashes)
        extra = event.extra_keys
        if not extra:
            return n, None
        lora = event.lora_name
        salt: str | None = None
        for i, entry in enumerate(extra[:n]):
            if not entry:
                continue
            rest: list[Any] = entry[1:] if lora is not None and entry[0] == lora else entry
            if not rest:
                continue
            if (
                i == 0
                and event.parent_block_hash is None
                and len(rest) == 1
                and isinstance(rest[0], str)
            ):
                salt = rest[0]
                continue
            return i, salt
        return n, salt

    def _store(self, rep: _Replica, event: BlockStored) -> None:
        counters = self.counters
        n_hashes = len(event.block_hashes)
        bs = self.block_size
        if self.engine_hash_keys and not event.token_ids:
            self._store_engine_keyed(rep, event)
            return
        if (
            event.block_size != bs
            or event.medium not in self.media
            or event.group_idx not in (None, 0)
            or len(event.token_ids) < n_hashes * bs
        ):
            counters.skipped_blocks += n_hashes
            return
        parent_key: int | None = None
        if event.parent_block_hash is not None:
            parent_key = rep.by_engine.get(event.parent_block_hash)
            if parent_key is None:
                counters.orphan_blocks += n_hashes
                return
        n, salt = self._indexable_blocks(event)
        counters.skipped_blocks += n_hashes - n
        if n == 0:
            return
        seed = seed_value(self.model, event.lora_name, salt)
        keys = block_keys(event.token_ids[: n * bs], bs, seed, parent=parent_key)
        by_engine = rep.by_engine
        refs = rep.refs
        bitmap = self._bitmap
        bit = rep.bit
        for engine_hash, key in zip(event.block_hashes, keys, strict=False):
            old = by_engine.get(engine_hash)
            if old is not None:
                by_engine.move_to_end(engine_hash)
                if old == key:
                    counters.duplicate_blocks += 1
                    continue
                # Same engine hash, other tokens: an engine restart we did not see. Re-point.
                self._unref(rep, old)
            by_engine[engine_hash] = key
            count = refs.get(key, 0)
            refs[key] = count + 1
            if count == 0:
                bitmap.add(bit, key)
            counters.blocks_stored += 1
        excess = len(by_engine) - self.max_blocks_per_replica
        while excess > 0:
            _, key = by_engine.popitem(last=False)
            self._unref(rep, key)
            counters.cap_evictions += 1
            excess -= 1

    def _store_engine_keyed(self, rep: _Replica, event: BlockStored) -> None:
        """Token-free events (the fleet simulator's engines): the engine's int hashes are the
        keys. Requests must then be matched with the same hashes (``keys_for`` does not apply)."""
        counters = self.counters
        if (
            event.block_size != self.block_size
            or event.medium not in self.media
            or event.group_idx not in (None, 0)
        ):
            counters.skipped_blocks += len(event.block_hashes)
            return
        by_engine = rep.by_engine
        if event.parent_block_hash is not None and event.parent_block_hash not in by_engine:
            counters.orphan_blocks += len(event.block_hashes)
            return
        refs = rep.refs
        bitmap = self._bitmap
        bit = rep.bit
        for engine_hash in event.block_hashes:
            if not isinstance(engine_hash, int):
                counters.skipped_blocks += 1
                continue
            if engine_hash in by_engine:
                by_engine.move_to_end(engine_hash)
                counters.duplicate_blocks += 1
                continue
            by_engine[engine_hash] = engine_hash
            count = refs.get(engine_hash, 0)
            refs[engine_hash] = count + 1
            if count == 0:
                bitmap.add(bit, engine_hash)
            counters.blocks_stored += 1
        excess = len(by_engine) - self.max_blocks_per_replica
        while excess > 0:
            _, key = by_engine.popitem(last=False)
            self._unref(rep, key)
            counters.cap_evictions += 1
            excess -= 1

    def _unref(self, rep: _Replica, key: int) -> None:
        count = rep.refs[key] - 1
        if count:
            rep.refs[key] = count
        else:
            del rep.refs[key]
            self._bitmap.discard(rep.bit, key)

    def _remove(self, rep: _Replica, event: BlockRemoved) -> None:
        counters = self.counters
        if event.medium not in self.media or event.group_idx not in (None, 0):
            return
        by_engine = rep.by_engine
        for engine_hash in event.block_hashes:
            key = by_engine.pop(engine_hash, None)
            if key is None:
                counters.removed_unknown += 1
                continue
            self._unref(rep, key)
            counters.blocks_removed += 1
