"""Issue 14 (connect storm): `coordinator.listen_backlog` is the backlog the kernel uses.

The listening socket's own `TCP_INFO` says so (Linux: for a socket in LISTEN `tcpi_sacked` is
its accept-queue limit, `sk_max_ack_backlog`, and `tcpi_unacked` the connections waiting in
it). Before the fix asyncio's `create_server` called `listen()` again with uvicorn's default
(2048), so the setting had no effect; the `connect-storm` bench found it (an accept queue of
291 against `listen_backlog: 16`). Then, with the coordinator's loop held (a starved
coordinator accepts nothing), a storm of connects fills the accept queue to the backlog + 1
and no further: the kernel drops the other SYNs (the clients send them again after 1 s).
"""

from __future__ import annotations

import socket
import struct
import time

from pdorch.app.server import run_coordinator
from pools.inloop_server import InLoopHttpServer
from tests.coordinator.helpers import fleet

# struct tcp_info: 8 bytes of u8 fields, then u32 rto, ato, snd_mss, rcv_mss, unacked, sacked
_UNACKED_SACKED = struct.Struct("=8x4xIIIII")


def accept_queue(sock: socket.socket) -> tuple[int, int]:
    """(connections waiting to be accepted, the accept queue's limit) of a listening socket."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    _ato, _snd, _rcv, unacked, sacked = _UNACKED_SACKED.unpack_from(info)
    return unacked, sacked


def _listening(server: InLoopHttpServer) -> socket.socket:
    sock = server._sock  # the bound socket the server listens on (its own, by design)
    assert sock is not None
    return sock


async def test_the_listen_backlog_setting_is_the_kernels_and_bounds_a_storm() -> None:
    backlog = 8
    async with run_coordinator(fleet(coordinator={"listen_backlog": backlog})) as pd:
        listening = _listening(pd.server)
        assert accept_queue(listening) == (0, backlog)
        host, port = pd.url.removeprefix("http://").split(":")
        # the loop is held from here to the end of the block: nothing is accepted meanwhile
        storm = []
        try:
            for _ in range(4 * backlog):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                s.connect_ex((host, int(port)))
                storm.append(s)
            deadline = time.monotonic() + 5.0
            # the kernel completes the handshakes (loopback: within microseconds); polled
            # without yielding, so the coordinator's loop (this one) accepts nothing meanwhile
            while accept_queue(listening)[0] < backlog + 1 and time.monotonic() < deadline:
                pass
            waiting, limit = accept_queue(listening)
            assert (waiting, limit) == (backlog + 1, backlog)
        finally:
            for s in storm:
                s.close()


async def test_inloop_server_listens_with_its_backlog() -> None:
    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("not called")

    async with InLoopHttpServer(app, backlog=37) as server:
        assert accept_queue(_listening(server)) == (0, 37)
