"""Lease bookkeeping for held blocks: pure, clock passed in.

Shared by the block movers (real seconds) and the simulated engine's connector state
(`pools/sim/kv_connector.py`, simulated seconds): one table, one expiry rule.

The owner of a finished prefill keeps its blocks until the puller says it is done (notification)
or until the lease runs out, whichever comes first; the puller can extend the lease while it
waits (queueing, slow fabric). This table is the whole policy; the movers only drive it with
`time.monotonic()` and act on what it returns. Expiry uses a heap with lazy deletion, so a tick
costs O(expired · log n) however many leases are held.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Lease:
    """Blocks held for one request until `expires_at` (monotonic seconds)."""

    request_id: str
    block_ids: tuple[int, ...]
    expires_at: float


class LeaseTable:
    """Request id → lease. A request id is held at most once at a time."""

    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}
        self._heap: list[tuple[float, str]] = []
        self._blocks_held = 0  # kept, not summed: the simulated engine reads it every scrape

    def __len__(self) -> int:
        return len(self._leases)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._leases

    @property
    def blocks_held(self) -> int:
        """Block references held (a block shared by two requests counts twice)."""
        return self._blocks_held

    def hold(self, request_id: str, block_ids: Sequence[int], expires_at: float) -> Lease:
        """Start a lease. Raises ValueError if `request_id` is already held."""
        if request_id in self._leases:
            raise ValueError(f"request {request_id!r} already holds blocks")
        lease = Lease(request_id, tuple(block_ids), expires_at)
        self._leases[request_id] = lease
        self._blocks_held += len(lease.block_ids)
        heapq.heappush(self._heap, (expires_at, request_id))
        return lease

    def get(self, request_id: str) -> Lease | None:
        return self._leases.get(request_id)

    def extend(self, request_id: str, expires_at: float) -> Lease | None:
        """Move the expiry to `expires_at` if later (never shortens); None if not held."""
        lease = self._leases.get(request_id)
        if lease is None:
            return None
        if expires_at > lease.expires_at:
            lease = Lease(lease.request_id, lease.block_ids, expires_at)
            self._leases[request_id] = lease
            heapq.heappush(self._heap, (expires_at, request_id))
        return lease

    def release(self, request_id: str) -> Lease | None:
        """End a lease now (notification or owner abort); None if not held."""
        lease = self._leases.pop(request_id, None)
        if lease is not None:
            self._blocks_held -= len(lease.block_ids)
        return lease

    def pop_expired(self, now: float) -> list[Lease]:
        """Remove and return every lease with `expires_at <= now`."""
        expired: list[Lease] = []
        while self._heap and self._heap[0][0] <= now:
            at, request_id = heapq.heappop(self._heap)
            lease = self._leases.get(request_id)
            # Stale heap entries (extended or released leases) are skipped here.
            if lease is not None and lease.expires_at == at:
                del self._leases[request_id]
                self._blocks_held -= len(lease.block_ids)
                expired.append(lease)
        return expired

    def next_expiry(self) -> float | None:
        """The earliest live expiry, or None when nothing is held."""
        while self._heap:
            at, request_id = self._heap[0]
            lease = self._leases.get(request_id)
            if lease is not None and lease.expires_at == at:
                return at
            heapq.heappop(self._heap)
        return None

    def snapshot(self) -> dict[str, list[int]]:
        return {rid: list(lease.block_ids) for rid, lease in self._leases.items()}
