"""The logic both block movers share: the owner half (leases, the side-channel server) on top
of the puller half (`transfer/puller.py`); the contract itself (`BlockMover` and its records)
is `transfer/contract.py`.

A mover is both sides at once, like a vLLM engine in `kv_both` role: it owns one `KvBlockPool`,
holds blocks of finished prefills under leases for others to pull, and pulls other owners'
blocks into its own pool. Subclasses only supply the data path (`_transfer`) and the backend's
own setup/teardown; validation, leases, handshakes, deadlines and peer death are handled here
and in `PullerBase`, so NIXL and the TCP fallback behave identically to callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

import zmq
import zmq.asyncio

from transfer.contract import (
    DEFAULT_LEASE_S,
    DEFAULT_TIMEOUT_S,
    MoverStats,
    Released,
    ReleaseReason,
)
from transfer.errors import (
    BadBlockIds,
)
from transfer.lease import LeaseTable
from transfer.params import PeerAddress
from transfer.pool import KvBlockPool
from transfer.puller import PullerBase
from transfer.side_channel import (
    BeginPull,
    Extend,
    Fail,
    Hello,
    HelloReply,
    Notify,
    Ok,
    Read,
    Reply,
    Request,
    SideChannelServer,
)

log = logging.getLogger(__name__)


class MoverBase(PullerBase):
    """Shared owner logic over the puller's (`PullerBase`); see the module docstring."""

    def __init__(
        self,
        pool: KvBlockPool,
        *,
        engine_id: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        on_release: Callable[[Released], None] | None = None,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        super().__init__(pool, default_timeout_s=default_timeout_s)
        self.engine_id = engine_id or uuid.uuid4().hex
        self.host = host
        self._port = port
        self.on_release = on_release
        self.leases = LeaseTable()
        self._server: SideChannelServer | None = None
        self._tick_task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._address: PeerAddress | None = None
        # Request ids with a pull announced (BeginPull/Read) and not yet notified: while there
        # are any, the owner polls its backend hot (see NixlBlockMover).
        self._active_pulls: dict[str, float] = {}
        self._counters.update(released_notified=0, released_expired=0, released_released=0)

    # --- lifecycle -------------------------------------------------------------------------
    @property
    def address(self) -> PeerAddress:
        if self._address is None:
            raise RuntimeError("mover not started")
        return self._address

    async def start(self) -> None:
        if self._server is not None:
            return
        self._ctx = zmq.asyncio.Context.instance()
        self._wake = asyncio.Event()
        await self._start_backend()
        self._server = SideChannelServer(self._ctx, self.host, self._port, self._handle)
        self._server.start()
        self._address = PeerAddress(
            engine_id=self.engine_id, host=self.host, port=self._server.port
        )
        self._tick_task = asyncio.create_task(self._tick_loop(), name=f"mover-tick-{self.kind}")

    async def close(self) -> None:
        if self._tick_task is not None:
            self._tick_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tick_task
            self._tick_task = None
        for link in list(self._links.values()):
            self._drop_link(link)
        if self._closing_links:
            await asyncio.gather(*self._closing_links, return_exceptions=True)
        if self._server is not None:
            await self._server.close()
            self._server = None
        await self._close_backend()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- owner side (pure bookkeeping; `now` defaults to the monotonic clock) ---------------
    def hold(
        self,
        request_id: str,
        block_ids: Sequence[int],
        lease_s: float = DEFAULT_LEASE_S,
        now: float | None = None,
    ) -> None:
        """Keep `block_ids` for `request_id` until notified or `lease_s` from `now`."""
        ids = self.pool.check_ids(block_ids, "block_ids")
        if not ids:
            raise BadBlockIds("hold needs at least one block", request_id=request_id)
        now = time.monotonic() if now is None else now
        try:
            self.leases.hold(request_id, ids, now + lease_s)
        except ValueError as exc:
            raise BadBlockIds(str(exc), request_id=request_id) from None
        self._poke()

    def extend_lease(self, request_id: str, lease_s: float, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.leases.extend(request_id, now + lease_s) is not None

    def release(self, request_id: str) -> bool:
        """Owner-initiated free (e.g. the request was aborted)."""
        return self._end_lease(request_id, "released")

    def held(self) -> dict[str, list[int]]:
        return self.leases.snapshot()

    def _end_lease(self, request_id: str, reason: ReleaseReason) -> bool:
        lease = self.leases.release(request_id)
        self._active_pulls.pop(request_id, None)
        if lease is None:
            return False
        self._emit(Released(request_id, lease.block_ids, reason))
        return True

    def _emit(self, released: Released) -> None:
        self._counters[f"released_{released.reason}"] += 1
        if self.on_release is not None:
            try:
                self.on_release(released)
            except Exception:
                log.exception("on_release callback failed for %s", released.request_id)

    def _expire(self, now: float) -> None:
        for lease in self.leases.pop_expired(now):
            self._active_pulls.pop(lease.request_id, None)
            self._emit(Released(lease.request_id, lease.block_ids, "expired"))
        for request_id, until in list(self._active_pulls.items()):
            if until <= now:
                del self._active_pulls[request_id]

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _tick_loop(self) -> None:
        """Expire leases on time and give the backend its periodic poll."""
        assert self._wake is not None
        while True:
            now = time.monotonic()
            self._expire(now)
            try:
                await self._backend_tick()
            except Exception:  # keep expiring leases even if one backend poll fails
                log.exception("%s mover: backend poll failed", self.kind)
            interval = self._tick_interval()
            next_expiry = self.leases.next_expiry()
            if next_expiry is not None:
                interval = min(interval, max(0.0, next_expiry - time.monotonic()))
            if interval <= 0.002:
                await asyncio.sleep(interval)
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval)

    def _check_held(self, request_id: str, block_ids: list[int]) -> Fail | None:
        lease = self.leases.get(request_id)
        if lease is None:
            return Fail(
                seq=0,
                code="lease_not_found",
                message=f"{self.engine_id} holds no blocks for request {request_id!r} "
                "(lease expired, already freed, or never held)",
            )
        held = set(lease.block_ids)
        missing = [i for i in block_ids if i not in held]
        if missing:
            return Fail(
                seq=0,
                code="bad_block_ids",
                message=f"blocks {missing[:8]} are not held for request {request_id!r} "
                f"(held: {len(lease.block_ids)} blocks)",
            )
        return None

    def _handle(self, request: Request) -> tuple[Reply, Sequence[Any]]:
        now = time.monotonic()
        if isinstance(request, Hello):
            return self._hello(request.seq), ()
        if isinstance(request, BeginPull | Read):
            fail = self._check_held(request.request_id, request.block_ids)
            if fail is not None:
                fail.seq = request.seq
                return fail, ()
            hold_s = max(0.0, min(request.hold_s, 3600.0))
            self.leases.extend(request.request_id, now + hold_s)
            self._active_pulls[request.request_id] = now + hold_s
            self._poke()
            if isinstance(request, Read):
                return self._serve_read(request)
            return Ok(seq=request.seq), ()
        if isinstance(request, Extend):
            if self.extend_lease(request.request_id, request.lease_s, now):
                return Ok(seq=request.seq), ()
            fail = self._check_held(request.request_id, [])
            assert fail is not None
            fail.seq = request.seq
            return fail, ()
        if isinstance(request, Notify):
            self._end_lease(request.request_id, "notified")
            return Ok(seq=request.seq), ()
        raise AssertionError(f"unhandled request {request!r}")

    def _hello(self, seq: int) -> HelloReply:
        return HelloReply(
            seq=seq,
            engine_id=self.engine_id,
            kind=self.kind,
            num_blocks=self.pool.num_blocks,
            block_bytes=self.pool.block_bytes,
            base_address=self.pool.base_address,
            mem_type=self.pool.mem_type,
            device_id=self.pool.device_id,
            agent_metadata=self._agent_metadata(),
        )

    def stats(self) -> MoverStats:
        backend = self._backend_counters()
        return MoverStats(
            leases_held=len(self.leases),
            blocks_held=self.leases.blocks_held,
            pulls_ok=self._counters["pulls_ok"],
            pulls_failed=self._counters["pulls_failed"],
            bytes_pulled=self._counters["bytes_pulled"],
            inflight_pulls=self._counters["inflight_pulls"],
            xfer_handles_live=backend.get("xfer_handles_live", 0),
            dlists_live=backend.get("dlists_live", 0),
            remote_agents_live=backend.get("remote_agents_live", 0),
            registrations_live=backend.get("registrations_live", 0),
            peers_cached=sum(1 for link in self._links.values() if link.handshake is not None),
            released_notified=self._counters["released_notified"],
            released_expired=self._counters["released_expired"],
            released_owner=self._counters["released_released"],
        )

    # --- backend hooks ----------------------------------------------------------------------
    async def _start_backend(self) -> None:
        """Create agents, register the pool."""
        return None

    async def _close_backend(self) -> None:
        """Undo `_start_backend` (after all links are dropped)."""
        return None

    def _agent_metadata(self) -> bytes:
        return b""

    async def _backend_tick(self) -> None:
        """Periodic backend poll (NIXL: notifications, transfer states)."""
        return None

    def _tick_interval(self) -> float:
        return 0.5

    def _backend_counters(self) -> dict[str, int]:
        return {}

    def _serve_read(self, request: Read) -> tuple[Reply, Sequence[Any]]:
        return Fail(seq=request.seq, code="unsupported", message=f"{self.kind} mover"), ()
