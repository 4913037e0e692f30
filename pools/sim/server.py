"""Run a simulated engine as an HTTP server, in-process (tests, the coordinator's demo fleet) or
as the foreground process of `pdorch engine sim`.

In-process use::

    server = SimServer(SimEngineSettings(port=0, time_scale=0.01))
    url = await server.start()      # "http://127.0.0.1:<port>", serving
    ...
    await server.stop()

`port=0` lets the OS pick the port when the socket is bound, so many servers can start
concurrently without racing for free ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

from pools.sim.runner import SimEngine
from pools.sim.settings import SimEngineSettings

log = logging.getLogger(__name__)


def _server_class() -> type[Any]:
    import uvicorn

    class _NoSignalServer(uvicorn.Server):
        """uvicorn.Server that leaves signals to the host: with many servers in one process,
        each one swapping the SIGINT/SIGTERM handlers (and re-raising them on exit) is wrong."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return _NoSignalServer


class SimServer:
    """One simulated engine behind its own uvicorn server, on the running event loop."""

    def __init__(self, settings: SimEngineSettings) -> None:
        self.settings = settings
        self.engine = SimEngine(settings)
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None
        self.url: str | None = None

    async def start(self) -> str:
        """Start the engine and the HTTP server; return the base URL once it accepts requests."""
        import uvicorn

        from pools.sim.api import create_app

        _Server = _server_class()

        await self.engine.start()
        app = create_app(self.engine)
        family = socket.AF_INET6 if ":" in self.settings.host else socket.AF_INET
        # proto must be IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted connections only
        # then, and without it Nagle + delayed ACKs hold streamed tokens back ~40 ms
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.settings.host, self.settings.port))
        sock.listen(2048)
        sock.setblocking(False)
        self._sock = sock
        port = sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        server = _Server(config)
        self._server = server
        self._task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        while not server.started:
            if self._task.done():
                await self._task  # re-raises the start-up error
                raise RuntimeError("simulated engine HTTP server exited during start-up")
            await asyncio.sleep(0.005)
        host = self.settings.host
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self.url = f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"
        return self.url

    async def stop(self) -> None:
        """Stop serving, abort running requests, close sockets (idempotent)."""
        if self._server is not None:
            self._server.should_exit = True
        # the engine first: it ends open streams, so the HTTP server can close connections
        await self.engine.stop()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 5.0)
            self._task = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
