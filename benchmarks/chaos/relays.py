"""Local relays the chaos fleet can put between one engine and the coordinator, to break the
path without touching either process:

- `DelayProxy`: a TCP proxy for the engine's HTTP port that, while `delay_s` > 0, holds every
  chunk `delay_s` before forwarding it, each way (one-way latency added, throughput kept: a
  chunk's due time is its arrival + `delay_s`, chunks keep their order). Everything the
  coordinator sends that engine goes through it (legs, `/health` probes, `/tokenize`, metric
  scrapes); the KV events do not (their own ZMQ sockets).
- `EventRelay`: a ZMQ SUB → PUB relay for the engine's KV-event stream (multipart frames
  forwarded unchanged); while `dropping` every message is read and thrown away, as a
  blocked or overflowing socket loses them. The replay socket stays direct, so the coordinator
  sees the sequence gap at the first message after the loss and replays the missing ones.

Both run on the bench's event loop; `start()` returns the port to point the fleet file at,
`close()` stops them.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from pools.ports import free_port

_CHUNK = 64 * 1024


@dataclass
class DelayProxy:
    """127.0.0.1:`port` → 127.0.0.1:`target_port` with `delay_s` added each way."""

    target_port: int
    delay_s: float = 0.0
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> int:
        self.port = self.port or free_port()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        loop = asyncio.get_running_loop()
        pipes = [
            loop.create_task(self._pipe(reader, up_writer)),
            loop.create_task(self._pipe(up_reader, writer)),
        ]
        self._tasks.update(pipes)
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
                self._tasks.discard(pipe)
            for w in (writer, up_writer):
                w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward chunks, each at its arrival + `delay_s` (read at arrival)."""
        loop = asyncio.get_running_loop()
        due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def read() -> None:
            while data := await reader.read(_CHUNK):
                due.put_nowait((loop.time() + self.delay_s, data))
            due.put_nowait((loop.time() + self.delay_s, b""))

        reading = loop.create_task(read())
        try:
            while True:
                at, data = await due.get()
                wait = at - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            return
        finally:
            reading.cancel()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)


@dataclass
class EventRelay:
    """SUB on `source` (the engine's PUB) → PUB bound on 127.0.0.1:`port`."""

    source: str
    dropping: bool = False
    port: int = 0
    dropped: int = 0
    forwarded: int = 0
    _ctx: zmq.asyncio.Context | None = None
    _task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        self.port = self.port or free_port()
        self._ctx = zmq.asyncio.Context()
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(self.source)
        pub = self._ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(f"tcp://127.0.0.1:{self.port}")
        self._task = asyncio.get_running_loop().create_task(self._run(sub, pub))
        return self.port

    async def _run(self, sub: zmq.asyncio.Socket, pub: zmq.asyncio.Socket) -> None:
        try:
            while True:
                frames = await sub.recv_multipart()
                if self.dropping:
                    self.dropped += 1
                    continue
                await pub.send_multipart(frames)
                self.forwarded += 1
        finally:
            sub.close()
            pub.close()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._ctx is not None:
            self._ctx.term()
