"""The approximate KV index: what the router *sent* where, for engines that publish no events.

Assumption: a replica that served a prompt recently still caches its blocks. The router calls
:meth:`ApproxKvIndex.record` with the prompt's block keys (:mod:`router.block_keys`) when it
routes a request; :meth:`ApproxKvIndex.match` then answers like the precise index.

Forgetting (both pure, ``now`` in seconds on any monotonic clock passed in by the caller):

* TTL: an entry recorded (or re-recorded) at ``t`` is gone at ``now >= t + ttl_s``
  (default 120 s: vLLM keeps freed blocks until it needs the space, which under load is
  seconds to minutes);
* LRU: at most ``max_blocks_per_replica`` entries per replica (default 65,536 -- about 1M
  tokens at block size 16); recording past the cap drops the least recently recorded first.

Both are applied lazily: each replica keeps an ``OrderedDict`` in recording order, and each
call first pops expired entries off the front (amortised O(1) per entry). ``now`` must not go
backwards between calls (a smaller ``now`` is treated as the last one seen).

Public API (stable): :class:`ApproxKvIndex` (``record``, ``match``, ``expire``,
``remove_replica``, ``blocks``, ``replicas``), constants ``DEFAULT_TTL_S``,
``DEFAULT_APPROX_MAX_BLOCKS``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from router.replica_bitmap import ReplicaBitmap

DEFAULT_TTL_S = 120.0
DEFAULT_APPROX_MAX_BLOCKS = 65_536


class _Entries:
    __slots__ = ("bit", "recorded")

    def __init__(self, bit: int) -> None:
        self.bit = bit
        self.recorded: OrderedDict[int, float] = OrderedDict()


class ApproxKvIndex:
    """Prefix index from routing history with TTL + LRU; see module doc."""

    def __init__(
        self,
        ttl_s: float = DEFAULT_TTL_S,
        max_blocks_per_replica: int = DEFAULT_APPROX_MAX_BLOCKS,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        if max_blocks_per_replica <= 0:
            raise ValueError("max_blocks_per_replica must be positive")
        self.ttl_s = ttl_s
        self.max_blocks_per_replica = max_blocks_per_replica
        self.evicted_ttl = 0
        self.evicted_lru = 0
        self._bitmap = ReplicaBitmap()
        self._replicas: dict[str, _Entries] = {}
        self._now = float("-inf")
        # Earliest recording time still held (a lower bound); skips the scan while nothing can
        # have expired, so a match costs O(blocks) and not O(replicas) on most calls.
        self._oldest = float("inf")

    def record(self, replica_id: str, keys: Sequence[int], now: float) -> None:
        """``keys`` (a prompt's block keys) were routed to ``replica_id`` at ``now``."""
        now = self.expire(now)
        rep = self._replicas.get(replica_id)
        if rep is None:
            rep = _Entries(self._bitmap.bit(replica_id))
            self._replicas[replica_id] = rep
        recorded = rep.recorded
        bitmap = self._bitmap
        for key in keys:
            if key in recorded:
                recorded.move_to_end(key)
            else:
                bitmap.add(rep.bit, key)
            recorded[key] = now
        if keys:
            self._oldest = min(self._oldest, now)
        excess = len(recorded) - self.max_blocks_per_replica
        while excess > 0:
            key, _ = recorded.popitem(last=False)
            bitmap.discard(rep.bit, key)
            self.evicted_lru += 1
            excess -= 1

    def match(self, keys: Sequence[int], now: float) -> dict[str, int]:
        """Leading blocks of ``keys`` routed to each replica within the TTL (absent: 0)."""
        self.expire(now)
        return self._bitmap.match(keys)

    def expire(self, now: float) -> float:
        """Drop entries recorded at or before ``now - ttl_s``; returns the effective ``now``."""
        now = max(now, self._now)
        self._now = now
        horizon = now - self.ttl_s
        if self._oldest > horizon:
            return now
        bitmap = self._bitmap
        oldest = float("inf")
        for rep in self._replicas.values():
            recorded = rep.recorded
            while recorded:
                key, at = next(iter(recorded.items()))
                if at > horizon:
                    oldest = min(oldest, at)
                    break
                del recorded[key]
                bitmap.discard(rep.bit, key)
                self.evicted_ttl += 1
        self._oldest = oldest
        return now

    def remove_replica(self, replica_id: str) -> None:
        rep = self._replicas.pop(replica_id, None)
        if rep is not None:
            self._bitmap.release(replica_id, rep.recorded)

    def blocks(self, replica_id: str) -> int:
        rep = self._replicas.get(replica_id)
        return 0 if rep is None else len(rep.recorded)

    def replicas(self) -> list[str]:
        return list(self._replicas)
