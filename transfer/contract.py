"""The block mover contract: what `pools/` codes against (`BlockMover`), and the records it
returns (`Released`, `PullResult`, `MoverStats`) with the lease and deadline defaults.

`transfer/mover.py` (owner half) and `transfer/puller.py` (puller half) hold the logic both
movers share; `NixlBlockMover` and `TcpBlockMover` implement this protocol through them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Protocol, Self

from transfer.params import PeerAddress
from transfer.pool import KvBlockPool
from transfer.transports import KvTransport

ReleaseReason = Literal["notified", "expired", "released"]

DEFAULT_TIMEOUT_S = 10.0
"""Deadline of a pull (or notify/extend) when the caller gives none."""

DEFAULT_LEASE_S = 30.0
"""How long an owner keeps unclaimed blocks by default (vLLM's `kv_lease_duration` default)."""

PULL_HOLD_MARGIN_S = 1.0
"""A lease check extends the lease to the puller's deadline plus this, so the blocks cannot be
freed and reused while the puller may still be reading them."""


@dataclass(frozen=True)
class Released:
    """Blocks the owner no longer holds for `request_id` (free to reuse)."""

    request_id: str
    block_ids: tuple[int, ...]
    reason: ReleaseReason


@dataclass(frozen=True)
class PullResult:
    request_id: str
    num_blocks: int
    nbytes: int
    seconds: float
    kind: KvTransport

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


@dataclass(frozen=True)
class MoverStats:
    """Counters; the `*_live` ones and `leases_held` return to their baseline when nothing
    leaks (tests assert it)."""

    leases_held: int
    blocks_held: int
    pulls_ok: int
    pulls_failed: int
    bytes_pulled: int
    inflight_pulls: int
    xfer_handles_live: int
    dlists_live: int
    remote_agents_live: int
    registrations_live: int
    peers_cached: int
    released_notified: int
    released_expired: int
    released_owner: int


class BlockMover(Protocol):
    """What `pools/` codes against; `NixlBlockMover` and `TcpBlockMover` implement it."""

    kind: KvTransport
    pool: KvBlockPool

    @property
    def address(self) -> PeerAddress: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def hold(
        self,
        request_id: str,
        block_ids: Sequence[int],
        lease_s: float = ...,
        now: float | None = None,
    ) -> None: ...

    def extend_lease(self, request_id: str, lease_s: float, now: float | None = None) -> bool: ...

    def release(self, request_id: str) -> bool: ...

    def held(self) -> dict[str, list[int]]: ...

    async def pull(
        self,
        peer: PeerAddress,
        remote_block_ids: Sequence[int],
        local_block_ids: Sequence[int],
        request_id: str,
        deadline: float | None = None,
        *,
        notify: bool = True,
    ) -> PullResult: ...

    async def notify(
        self, peer: PeerAddress, request_id: str, deadline: float | None = None
    ) -> None: ...

    async def extend_remote_lease(
        self, peer: PeerAddress, request_id: str, lease_s: float, deadline: float | None = None
    ) -> None: ...

    def stats(self) -> MoverStats: ...
