"""The side channel: a ZMQ ROUTER on the owner, one DEALER per peer on the puller.

Carries the handshake (layout + NIXL agent metadata), the lease check before a pull, lease
extension, notifications and, for the TCP mover, the blocks themselves (as extra frames). Messages
are msgspec msgpack structs tagged by type: small, fast, and typed at both ends.

Why DEALER/ROUTER and not REQ/REP: several pulls to one peer run concurrently over one socket, so
replies are matched to requests by `seq`, and a request whose caller gave up (deadline) simply
has its late reply dropped. Why a socket monitor: ZMQ hides connection state, but a killed owner
closes its TCP socket and the monitor reports `EVENT_DISCONNECTED` within milliseconds; that is
how a pull against a dead peer fails fast (`PeerGone`) instead of waiting for its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from transfer.errors import PeerGone, TransferTimeout
from transfer.params import PeerAddress

log = logging.getLogger(__name__)


# --- requests (puller -> owner) ------------------------------------------------------------
class Hello(msgspec.Struct, tag="hello"):
    seq: int


class BeginPull(msgspec.Struct, tag="begin_pull"):
    """Check that `block_ids` are held for `request_id`; keep them at least `hold_s` more."""

    seq: int
    request_id: str
    block_ids: list[int]
    hold_s: float


class Extend(msgspec.Struct, tag="extend"):
    seq: int
    request_id: str
    lease_s: float


class Notify(msgspec.Struct, tag="notify"):
    seq: int
    request_id: str


class Read(msgspec.Struct, tag="read"):
    """TCP mover only: send these blocks back as frames (lease checked like BeginPull)."""

    seq: int
    request_id: str
    block_ids: list[int]
    hold_s: float


Request = Hello | BeginPull | Extend | Notify | Read


# --- replies (owner -> puller) -------------------------------------------------------------
class HelloReply(msgspec.Struct, tag="hello_reply"):
    seq: int
    engine_id: str
    kind: str
    num_blocks: int
    block_bytes: int
    base_address: int
    mem_type: str
    device_id: int
    agent_metadata: bytes = b""


class Ok(msgspec.Struct, tag="ok"):
    seq: int


class Fail(msgspec.Struct, tag="fail"):
    """`code`: lease_not_found | bad_block_ids | unsupported | bad_request."""

    seq: int
    code: str
    message: str


class ReadReply(msgspec.Struct, tag="read_reply"):
    """Followed by one frame per block, in the order asked."""

    seq: int
    num_blocks: int


Reply = HelloReply | Ok | Fail | ReadReply

_request_decoder = msgspec.msgpack.Decoder(Request)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_encoder = msgspec.msgpack.Encoder()

Handler = Callable[[Request], tuple[Reply, Sequence[Any]]]
"""Owner logic: a request → its reply plus extra frames (buffers sent without copying)."""


class SideChannelServer:
    """The owner's ROUTER: answers each request with `handler` on the event loop."""

    def __init__(self, ctx: zmq.asyncio.Context, host: str, port: int, handler: Handler) -> None:
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        bind_host = f"[{host}]" if ":" in host else host
        if ":" in host:
            self._sock.setsockopt(zmq.IPV6, 1)
        self._sock.bind(f"tcp://{bind_host}:{port if port else '*'}")
        endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.port = int(endpoint.rsplit(":", 1)[1])
        self._handler = handler
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._serve(), name="side-channel-server")

    async def _serve(self) -> None:
        while True:
            parts = await self._sock.recv_multipart()
            if len(parts) != 2:
                continue
            ident, payload = parts
            try:
                request = _request_decoder.decode(payload)
            except msgspec.DecodeError as exc:
                log.warning("side channel: undecodable request dropped: %s", exc)
                continue
            try:
                reply, frames = self._handler(request)
            except Exception as exc:  # a bug in one request must not kill the owner
                log.exception("side channel handler failed")
                reply, frames = Fail(seq=request.seq, code="bad_request", message=str(exc)), ()
            await self._sock.send_multipart([ident, _encoder.encode(reply), *frames], copy=False)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._sock.close(linger=0)


class PeerLink:
    """The puller's connection to one owner; `gone` is set once it is known dead.

    `handshake` caches the owner's HelloReply; `backend_state` is free for the mover (NIXL keeps
    the remote agent name and remote descriptor list there).
    """

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        peer: PeerAddress,
        on_gone: Callable[[PeerLink], None],
    ) -> None:
        self.peer = peer
        self.gone: str | None = None
        self.handshake: HelloReply | None = None
        self.handshake_lock = asyncio.Lock()
        self.backend_state: Any = None
        self._on_gone = on_gone
        self._seq = 0
        self._pending: dict[int, asyncio.Future[tuple[Reply, list[zmq.Frame]]]] = {}
        self._connected = False
        self._sock = ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if ":" in peer.host:
            self._sock.setsockopt(zmq.IPV6, 1)
        self._monitor = self._sock.get_monitor_socket(
            zmq.EVENT_CONNECTED
            | zmq.EVENT_HANDSHAKE_SUCCEEDED
            | zmq.EVENT_DISCONNECTED
            | zmq.EVENT_CONNECT_RETRIED
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        )
        self._sock.connect(peer.endpoint)
        self._tasks = [
            asyncio.create_task(self._receive(), name=f"peer-recv-{peer}"),
            asyncio.create_task(self._watch(), name=f"peer-watch-{peer}"),
        ]

    async def request(
        self, message: Request, deadline: float, request_id: str | None = None
    ) -> tuple[Reply, list[zmq.Frame]]:
        """Send `message` (its seq is assigned here) and await the reply until `deadline`."""
        if self.gone is not None:
            raise PeerGone(self.gone, peer=str(self.peer), request_id=request_id)
        self._seq += 1
        message.seq = self._seq
        future: asyncio.Future[tuple[Reply, list[zmq.Frame]]] = (
            asyncio.get_running_loop().create_future()
        )
        self._pending[message.seq] = future
        try:
            await self._sock.send(_encoder.encode(message))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            return await asyncio.wait_for(future, remaining)
        except TimeoutError:
            what = type(message).__name__
            raise TransferTimeout(
                f"{what} to {self.peer} got no reply before the deadline"
                + ("" if self._connected else " (never connected)"),
                peer=str(self.peer),
                request_id=request_id,
            ) from None
        finally:
            self._pending.pop(message.seq, None)

    async def _receive(self) -> None:
        while True:
            frames = await self._sock.recv_multipart(copy=False)
            try:
                reply = _reply_decoder.decode(frames[0].buffer)
            except msgspec.DecodeError:
                log.warning("side channel: undecodable reply from %s dropped", self.peer)
                continue
            future = self._pending.get(reply.seq)
            if future is not None and not future.done():
                future.set_result((reply, list(frames[1:])))

    async def _watch(self) -> None:
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())
            kind = event["event"]
            if kind in (zmq.EVENT_CONNECTED, zmq.EVENT_HANDSHAKE_SUCCEEDED):
                self._connected = True
            elif kind == zmq.EVENT_DISCONNECTED:
                self.mark_gone(f"side channel to {self.peer} disconnected (peer closed or died)")
                return
            elif kind == zmq.EVENT_CONNECT_RETRIED:
                self.mark_gone(f"side channel to {self.peer}: connection refused")
                return
            else:
                self.mark_gone(f"side channel to {self.peer}: handshake failed ({kind!r})")
                return

    def mark_gone(self, reason: str) -> None:
        if self.gone is not None:
            return
        self.gone = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(PeerGone(reason, peer=str(self.peer)))
        self._on_gone(self)

    async def close(self) -> None:
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        for task in self._tasks:
            if task is not asyncio.current_task():
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for future in self._pending.values():
            if not future.done():
                future.set_exception(PeerGone("link closed", peer=str(self.peer)))
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        self._monitor.close(linger=0)
        self._sock.close(linger=0)
