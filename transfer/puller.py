"""The puller half of a block mover: handshaken links to owners, pull-id checks, the pull
itself and the puller's requests to an owner (notify, lease heartbeat).

`MoverBase` (`transfer/mover.py`) adds the owner half on top; a backend (`NixlBlockMover`,
`TcpBlockMover`) supplies the data path (`_transfer`) and its per-peer setup. Validation,
handshakes, deadlines and peer death are handled here, so every backend pulls alike.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import zmq
import zmq.asyncio

from transfer.contract import DEFAULT_TIMEOUT_S, PULL_HOLD_MARGIN_S, PullResult
from transfer.errors import (
    BadBlockIds,
    LayoutMismatch,
    LeaseNotFound,
    PeerGone,
    TransferError,
    TransferFailed,
)
from transfer.params import PeerAddress
from transfer.pool import KvBlockPool
from transfer.side_channel import (
    BeginPull,
    Extend,
    Fail,
    Hello,
    HelloReply,
    Notify,
    Ok,
    PeerLink,
    Reply,
    Request,
)
from transfer.transports import KvTransport


def _raise_fail(reply: Fail, peer: PeerAddress, request_id: str) -> None:
    """Raise the `TransferError` an owner's `Fail` reply stands for."""
    if reply.code == "lease_not_found":
        raise LeaseNotFound(reply.message, peer=str(peer), request_id=request_id)
    if reply.code == "bad_block_ids":
        raise BadBlockIds(reply.message, peer=str(peer), request_id=request_id)
    raise TransferFailed(f"{reply.code}: {reply.message}", peer=str(peer), request_id=request_id)


@dataclass(frozen=True, slots=True)
class Pull:
    """One validated pull, as a backend's `_transfer` gets it: the owner's `remote` block ids
    into this pool's `local` ones (pairwise) over `link`, for `request_id`, by `deadline`
    (`time.monotonic()`), then, with `notify`, the owner told to free them."""

    link: PeerLink
    remote: list[int]
    local: list[int]
    request_id: str
    deadline: float
    notify: bool


class PullerBase(abc.ABC):
    """Pulls other owners' blocks into `pool`; see the module docstring."""

    kind: KvTransport  # set by each backend

    def __init__(self, pool: KvBlockPool, *, default_timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.pool = pool
        self.default_timeout_s = default_timeout_s
        self._ctx: zmq.asyncio.Context | None = None  # set when the mover starts
        self._links: dict[PeerAddress, PeerLink] = {}
        self._closing_links: set[asyncio.Task[None]] = set()
        self._counters = {"pulls_ok": 0, "pulls_failed": 0, "bytes_pulled": 0, "inflight_pulls": 0}

    def _deadline(self, deadline: float | None) -> float:
        return time.monotonic() + self.default_timeout_s if deadline is None else deadline

    async def _link(self, peer: PeerAddress, deadline: float, request_id: str) -> PeerLink:
        """The cached, handshaken link to `peer` (handshake on first use)."""
        assert self._ctx is not None, "mover not started"
        link = self._links.get(peer)
        if link is None or link.gone is not None:
            link = PeerLink(self._ctx, peer, self._drop_link)
            self._links[peer] = link
        if link.handshake is not None:
            return link
        async with link.handshake_lock:
            if link.handshake is not None:
                return link
            reply, _ = await link.request(Hello(seq=0), deadline, request_id)
            if not isinstance(reply, HelloReply):
                raise TransferFailed(f"bad handshake reply {reply!r}", peer=str(peer))
            if reply.engine_id != peer.engine_id:
                self._drop_link(link)
                raise PeerGone(
                    f"{peer.host}:{peer.port} is engine {reply.engine_id!r}, not "
                    f"{peer.engine_id!r} (restarted?)",
                    peer=str(peer),
                    request_id=request_id,
                )
            if reply.kind != self.kind:
                raise LayoutMismatch(
                    f"peer {peer} runs a {reply.kind!r} mover, this one is {self.kind.value!r}",
                    peer=str(peer),
                )
            await self._connect_backend(link, reply)
            link.handshake = reply
        return link

    def _drop_link(self, link: PeerLink) -> None:
        """Forget a peer: backend state first (NIXL remote agent), then the sockets."""
        if self._links.get(link.peer) is link:
            del self._links[link.peer]
        self._disconnect_backend(link)
        task = asyncio.get_running_loop().create_task(link.close())
        self._closing_links.add(task)
        task.add_done_callback(self._closing_links.discard)

    def _check_pull_ids(
        self,
        peer: PeerAddress,
        remote_block_ids: Sequence[int],
        local_block_ids: Sequence[int],
        request_id: str,
    ) -> tuple[list[int], list[int]]:
        if len(remote_block_ids) != len(local_block_ids):
            raise BadBlockIds(
                f"remote_block_ids has {len(remote_block_ids)} ids, local_block_ids "
                f"{len(local_block_ids)}",
                peer=str(peer),
                request_id=request_id,
            )
        if not local_block_ids:
            raise BadBlockIds("nothing to pull: no block ids", request_id=request_id)
        try:
            local = self.pool.check_ids(local_block_ids, "local_block_ids")
        except BadBlockIds as exc:
            raise BadBlockIds(str(exc), peer=str(peer), request_id=request_id) from None
        remote: list[int] = []
        seen: set[int] = set()
        for pos, raw in enumerate(remote_block_ids):
            if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0 or raw in seen:
                raise BadBlockIds(
                    f"remote_block_ids[{pos}] = {raw!r} is not a new non-negative int",
                    peer=str(peer),
                    request_id=request_id,
                )
            seen.add(raw)
            remote.append(int(raw))
        return remote, local

    async def pull(
        self,
        peer: PeerAddress,
        remote_block_ids: Sequence[int],
        local_block_ids: Sequence[int],
        request_id: str,
        deadline: float | None = None,
        *,
        notify: bool = True,
    ) -> PullResult:
        """Copy the owner's `remote_block_ids` into this pool's `local_block_ids` (pairwise).

        One batched transfer; then (with `notify`) the owner is told to free the blocks.
        Raises a `TransferError` subclass; on any error nothing stays posted.
        """
        deadline = self._deadline(deadline)
        started = time.perf_counter()
        self._counters["inflight_pulls"] += 1
        try:
            remote, local = self._check_pull_ids(
                peer, remote_block_ids, local_block_ids, request_id
            )
            link = await self._link(peer, deadline, request_id)
            hello = link.handshake
            assert hello is not None
            if hello.block_bytes != self.pool.block_bytes:
                raise LayoutMismatch(
                    f"peer blocks are {hello.block_bytes} bytes, local {self.pool.block_bytes}",
                    peer=str(peer),
                    request_id=request_id,
                )
            too_big = [i for i in remote if i >= hello.num_blocks]
            if too_big:
                raise BadBlockIds(
                    f"remote_block_ids {too_big[:8]} out of range: peer has "
                    f"{hello.num_blocks} blocks",
                    peer=str(peer),
                    request_id=request_id,
                )
            await self._transfer(Pull(link, remote, local, request_id, deadline, notify))
        except TransferError as exc:
            self._counters["pulls_failed"] += 1
            if exc.request_id is None:
                exc.request_id = request_id
            raise
        except BaseException:
            self._counters["pulls_failed"] += 1
            raise
        finally:
            self._counters["inflight_pulls"] -= 1
        seconds = time.perf_counter() - started
        nbytes = len(local) * self.pool.block_bytes
        self._counters["pulls_ok"] += 1
        self._counters["bytes_pulled"] += nbytes
        return PullResult(request_id, len(local), nbytes, seconds, self.kind)

    async def _ask(
        self, link: PeerLink, message: Request, deadline: float, request_id: str
    ) -> tuple[Reply, list[zmq.Frame]]:
        """`link.request`, an owner's `Fail` raised as the `TransferError` it stands for."""
        reply, frames = await link.request(message, deadline, request_id)
        if isinstance(reply, Fail):
            _raise_fail(reply, link.peer, request_id)
        return reply, frames

    @staticmethod
    def _pull_hold_s(deadline: float) -> float:
        """How long the owner must keep the blocks of a pull due by `deadline` (plus a margin
        for the notify that follows)."""
        return max(0.0, deadline - time.monotonic()) + PULL_HOLD_MARGIN_S

    async def _begin_pull(
        self, link: PeerLink, remote: list[int], request_id: str, deadline: float
    ) -> None:
        hold_s = self._pull_hold_s(deadline)
        message = BeginPull(seq=0, request_id=request_id, block_ids=remote, hold_s=hold_s)
        await self._ask(link, message, deadline, request_id)

    async def notify(
        self, peer: PeerAddress, request_id: str, deadline: float | None = None
    ) -> None:
        """Tell the owner it may free `request_id`'s blocks (e.g. decode gave up on them)."""
        deadline = self._deadline(deadline)
        link = await self._link(peer, deadline, request_id)
        await self._ask(link, Notify(seq=0, request_id=request_id), deadline, request_id)

    async def extend_remote_lease(
        self, peer: PeerAddress, request_id: str, lease_s: float, deadline: float | None = None
    ) -> None:
        """Heartbeat: keep the owner's blocks for `request_id` `lease_s` more seconds."""
        deadline = self._deadline(deadline)
        link = await self._link(peer, deadline, request_id)
        message = Extend(seq=0, request_id=request_id, lease_s=lease_s)
        reply, _ = await self._ask(link, message, deadline, request_id)
        if not isinstance(reply, Ok):
            raise TransferFailed(f"bad reply {reply!r}", peer=str(peer), request_id=request_id)

    # --- backend hooks ----------------------------------------------------------------------
    async def _connect_backend(self, link: PeerLink, hello: HelloReply) -> None:
        """Per-peer setup after the handshake (NIXL: add the remote agent)."""
        return None

    def _disconnect_backend(self, link: PeerLink) -> None:
        """Undo `_connect_backend`; must not raise."""
        return None

    @abc.abstractmethod
    async def _transfer(self, pull: Pull) -> None:
        """Move the (validated) blocks and, with `pull.notify`, tell the owner."""
