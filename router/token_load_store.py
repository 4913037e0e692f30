"""The entry store under `TokenLoad` (router/token_load.py): the (request, replica) entries,
the per-replica totals kept incrementally (never negative), the change log a `ColumnBuilder`
reads (`changes_since`), tombstones, and the exchange of entries between coordinators. Split
from token_load.py (507 lines, issue 15) at its seam: `TokenLoad` says *what* each lifecycle
event does to an entry; this class is how an entry is stored, counted, versioned and shared.

Sharing between coordinator replicas: entries learned from another coordinator change only
through its deltas (local `on_prefill_done`/`on_tokens` ignore them); every local change marks
its entry dirty;
`export_deltas()` drains one `TokenLoadDelta` per dirty entry carrying the entry's *absolute*
state and a per-origin version, and `apply_delta()` on another coordinator keeps the highest
version per entry. Absolute state + versions make the exchange idempotent and tolerant of
duplicates and reordering, so replicas converge (eventual consistency).
"""

from __future__ import annotations

import heapq

from router.replica_state import ReplicaLoad
from router.token_load_entries import EngineMetrics as _Metrics
from router.token_load_entries import Entry as _Entry
from router.token_load_entries import Key as _Key
from router.token_load_entries import TokenLoadDelta
from router.token_load_entries import Totals as _Totals
from router.token_load_entries import blocks as _blocks

__all__ = ["CHANGE_WINDOW", "TokenLoadStore"]
CHANGE_WINDOW = 4096  # load changes `changes_since` can always answer for


class TokenLoadStore:
    """Entries, totals, change log, tombstones and deltas (module docstring); `TokenLoad`
    builds the lifecycle and the load views on it."""

    def __init__(
        self,
        origin: str = "local",
        stale_after_s: float = 30.0,
        tombstone_ttl_s: float = 300.0,
    ) -> None:
        self.origin = origin
        self.stale_after_s = stale_after_s
        self.tombstone_ttl_s = tombstone_ttl_s
        self._entries: dict[_Key, _Entry] = {}
        self._by_replica: dict[str, set[_Key]] = {}
        self._by_request: dict[str, set[_Key]] = {}
        self._totals: dict[str, _Totals] = {}
        self._metrics: dict[str, _Metrics] = {}
        self._tombstones: dict[_Key, tuple[float, str, int]] = {}
        # Loads change only on events, so each replica's `ReplicaLoad` is built once per change,
        # not once per routing decision (a decision reads every candidate's).
        self._load_cache: dict[str, ReplicaLoad] = {}
        # Every replica whose load changed, in order (`changes_since`): a reader of every
        # candidate's load (`router.replica_columns.ColumnBuilder`) re-reads only those.
        # Positions count from the start; the oldest half is dropped past the window.
        self._change_log: list[str] = []
        self._change_base = 0
        # (time, key) of every tombstone set, so expiry pops the old ones instead of scanning
        # all of them on every scrape; entries no longer current are skipped.
        self._tombstone_heap: list[tuple[float, _Key]] = []
        self._version = 0
        self._dirty: set[_Key] = set()

    # ---- change log ------------------------------------------------------------------------

    def changes_since(self, position: int) -> tuple[int, list[str]] | None:
        """The replicas whose load changed since change-log `position` (with repeats), and the
        position to ask from next time; None when `position` is older than the log keeps
        (`CHANGE_WINDOW` changes) or negative: re-read every replica then."""
        start = position - self._change_base
        if position < 0 or start < 0:
            return None
        log = self._change_log
        return self._change_base + len(log), log[start:]

    def change_position(self) -> int:
        """The change-log position now (`changes_since`)."""
        return self._change_base + len(self._change_log)

    def _changed(self, replica_id: str) -> None:
        self._load_cache.pop(replica_id, None)
        log = self._change_log
        log.append(replica_id)
        if len(log) > 2 * CHANGE_WINDOW:
            del log[:CHANGE_WINDOW]
            self._change_base += CHANGE_WINDOW

    # ---- sharing between coordinators --------------------------------------------------------

    def export_deltas(self) -> list[TokenLoadDelta]:
        """Drain the local changes since the last export, one absolute-state record per entry."""
        deltas: list[TokenLoadDelta] = []
        for key in sorted(self._dirty):
            request_id, replica_id = key
            entry = self._entries.get(key)
            if entry is not None:
                if entry.origin != self.origin:
                    continue
                deltas.append(entry.delta(request_id, replica_id))
                continue
            tomb = self._tombstones.get(key)
            if tomb is not None and tomb[1] == self.origin:
                deltas.append(
                    TokenLoadDelta(
                        origin=tomb[1],
                        version=tomb[2],
                        request_id=request_id,
                        replica_id=replica_id,
                        removed=True,
                        updated_at=tomb[0],
                    )
                )
        self._dirty.clear()
        return deltas

    def apply_delta(self, delta: TokenLoadDelta, now: float) -> bool:
        """Merge another coordinator's record; returns whether it changed anything.

        Records from this coordinator's own origin are ignored (it already has them); for each
        entry the highest version from its origin wins.
        """
        if delta.origin == self.origin:
            return False
        key = (delta.request_id, delta.replica_id)
        tomb = self._tombstones.get(key)
        if tomb is not None and tomb[1] == delta.origin and tomb[2] >= delta.version:
            return False
        entry = self._entries.get(key)
        if entry is not None and entry.origin == delta.origin and entry.version >= delta.version:
            return False
        if delta.removed:
            if entry is not None:
                self._drop(key, now)
            self._tombstones[key] = (delta.updated_at, delta.origin, delta.version)
            heapq.heappush(self._tombstone_heap, (delta.updated_at, key))
            return True
        new = _Entry.of_delta(delta, now)
        if entry is not None:
            self._drop(key, now)
        self._insert(key, new, now)
        return True

    # ---- internals ---------------------------------------------------------------------------

    def _next_version(self) -> int:
        self._version += 1
        return self._version

    def _keys_of(self, request_id: str, replica_id: str | None) -> list[_Key]:
        if replica_id is not None:
            return [(request_id, replica_id)]
        return list(self._by_request.get(request_id, ()))

    def _insert(self, key: _Key, entry: _Entry, now: float) -> None:
        self._entries[key] = entry
        self._by_replica.setdefault(key[1], set()).add(key)
        self._by_request.setdefault(key[0], set()).add(key)
        totals = self._totals.setdefault(key[1], _Totals())
        totals.prefill_tokens += entry.prefill_tokens
        totals.decode_blocks += entry.decode_blocks
        if entry.reserved:
            totals.reserved_blocks += entry.decode_blocks
        totals.requests += 1
        totals.last_change = now
        self._changed(key[1])

    def _set(
        self, key: _Key, entry: _Entry, now: float, *, prefill_tokens: int, generated: int
    ) -> None:
        decode_blocks = _blocks(entry.prompt_tokens + generated, entry.block_size)
        totals = self._totals.setdefault(key[1], _Totals())
        totals.prefill_tokens = max(
            0, totals.prefill_tokens + prefill_tokens - entry.prefill_tokens
        )
        totals.decode_blocks = max(0, totals.decode_blocks + decode_blocks - entry.decode_blocks)
        if entry.reserved:
            totals.reserved_blocks = max(
                0, totals.reserved_blocks + decode_blocks - entry.decode_blocks
            )
        totals.last_change = now
        self._changed(key[1])
        entry.prefill_tokens = prefill_tokens
        entry.generated = generated
        entry.decode_blocks = decode_blocks
        entry.updated_at = now
        if entry.origin == self.origin:
            entry.version = self._next_version()
            self._dirty.add(key)

    def _drop(self, key: _Key, now: float) -> _Entry | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        keys = self._by_replica.get(key[1])
        if keys is not None:
            keys.discard(key)
        same_request = self._by_request.get(key[0])
        if same_request is not None:
            same_request.discard(key)
            if not same_request:
                del self._by_request[key[0]]
        totals = self._totals.get(key[1])
        if totals is not None:
            totals.prefill_tokens = max(0, totals.prefill_tokens - entry.prefill_tokens)
            totals.decode_blocks = max(0, totals.decode_blocks - entry.decode_blocks)
            if entry.reserved:
                totals.reserved_blocks = max(0, totals.reserved_blocks - entry.decode_blocks)
            totals.requests = max(0, totals.requests - 1)
            totals.last_change = now
        self._changed(key[1])
        return entry

    def _remove(self, key: _Key, now: float) -> None:
        entry = self._drop(key, now)
        if entry is None:
            return
        origin = entry.origin
        version = self._next_version() if origin == self.origin else entry.version
        self._tombstones[key] = (now, origin, version)
        heapq.heappush(self._tombstone_heap, (now, key))
        if origin == self.origin:
            self._dirty.add(key)

    def _forget_old_tombstones(self, now: float) -> None:
        horizon = now - self.tombstone_ttl_s
        heap = self._tombstone_heap
        tombstones = self._tombstones
        while heap and heap[0][0] < horizon:
            at, key = heapq.heappop(heap)
            tomb = tombstones.get(key)
            if tomb is not None and tomb[0] == at:
                del tombstones[key]
                self._dirty.discard(key)
