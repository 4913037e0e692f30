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

import logging

from pools.inloop_server import InLoopHttpServer
from pools.sim.runner import SimEngine
from pools.sim.settings import SimEngineSettings

log = logging.getLogger(__name__)


class SimServer:
    """One simulated engine behind its own uvicorn server, on the running event loop."""

    def __init__(self, settings: SimEngineSettings) -> None:
        self.settings = settings
        self.engine = SimEngine(settings)
        self._http: InLoopHttpServer | None = None
        self.url: str | None = None

    async def start(self) -> str:
        """Start the engine and the HTTP server; return the base URL once it accepts requests."""
        from pools.sim.api import create_app

        await self.engine.start()
        self._http = InLoopHttpServer(
            create_app(self.engine), self.settings.host, self.settings.port, graceful_shutdown_s=1
        )
        try:
            self.url = await self._http.start()
        except BaseException:
            await self.engine.stop()  # e.g. the port is taken: leave nothing running
            raise
        return self.url

    async def stop(self) -> None:
        """Stop serving, abort running requests, close sockets (idempotent)."""
        if self._http is not None:
            self._http.request_stop()
        # the engine first: it ends open streams, so the HTTP server can close connections
        await self.engine.stop()
        if self._http is not None:
            await self._http.stop()
