"""`HeadCork` (`pdorch/app/edge.py`): an answer's head goes out with its first body bytes in
one transport write, alone at the next loop turn when no body follows, and a close never
loses it."""

from __future__ import annotations

import asyncio
from typing import Any

from pdorch.app.edge import HeadCork


class RecordingTransport(asyncio.Transport):
    """A transport that keeps every write (the kernel side is not under test here)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


class Cycle:
    transport: Any


def _corked() -> tuple[RecordingTransport, Cycle]:
    transport, cycle = RecordingTransport(), Cycle()
    cycle.transport = HeadCork(transport, cycle, asyncio.get_running_loop())
    return transport, cycle


async def test_head_and_body_are_one_write() -> None:
    transport, cycle = _corked()
    cycle.transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert transport.writes == []
    cycle.transport.write(b"{}")
    assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}"]
    assert cycle.transport is transport  # later writes go straight to the socket
    await asyncio.sleep(0)  # the pending flush was cancelled: nothing more is written
    assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}"]


async def test_a_head_with_no_body_yet_goes_out_next_turn() -> None:
    transport, cycle = _corked()
    cycle.transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    await asyncio.sleep(0)
    assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\n"]
    assert cycle.transport is transport
    cycle.transport.write(b"data: 1\n\n")
    assert transport.writes[-1] == b"data: 1\n\n"


async def test_close_sends_the_held_head_first() -> None:
    transport, cycle = _corked()
    cycle.transport.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    cycle.transport.close()
    assert transport.writes == [b"HTTP/1.1 204 No Content\r\n\r\n"]
    assert transport.closed
