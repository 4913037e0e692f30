"""Run the coordinator: its HTTP server on the running event loop, and a whole fleet + server.

```python
async with run_coordinator(config, port=0) as running:   # engines, coordinator, HTTP server
    running.url                      # "http://127.0.0.1:<port>"
    running.coordinator              # router state, fleet, metrics (tests, benchmarks)
    running.fleet                    # pools.launch.RunningFleet (launched engines)
# on exit: server stopped, coordinator stopped, every engine it launched stopped
```

`CoordinatorServer(app, host, port)` alone serves an app for a fleet someone else owns (the
proxy benchmark). `port=0` binds before serving (the OS picks), so starts never race.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from pdorch.app.api import create_app
from pdorch.app.state import Coordinator, CoordinatorLimits
from pdorch.config.fleet import FleetConfig
from pools.launch import RunningFleet, launch_fleet


def _server_class() -> type[Any]:
    import uvicorn

    class _HostSignalsServer(uvicorn.Server):
        """Leaves SIGINT/SIGTERM to the host (`pdorch serve` stops engines too)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return _HostSignalsServer


class CoordinatorServer:
    """uvicorn serving `app` on the running loop."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 8000) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.url: str | None = None
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None

    async def start(self) -> str:
        """Bind, serve, and return the base URL once it accepts connections."""
        import uvicorn

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP so asyncio sets TCP_NODELAY on accepted sockets (no Nagle on SSE)
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        sock.listen(4096)
        sock.setblocking(False)
        self._sock = sock
        port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            # httptools' C parser when installed (uvicorn[standard]); the loop is whatever runs
            # us (`pdorch serve` runs on uvloop when installed)
            http="httptools" if importlib.util.find_spec("httptools") else "h11",
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
            timeout_keep_alive=30,
        )
        server = _server_class()(config)
        self._server = server
        self._task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        while not server.started:
            if self._task.done():
                await self._task
                raise RuntimeError("coordinator HTTP server exited during start-up")
            await asyncio.sleep(0.005)
        shown = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        self.url = f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"
        return self.url

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 5.0)
            self._task = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None


@dataclass
class RunningCoordinator:
    url: str
    coordinator: Coordinator
    fleet: RunningFleet
    server: CoordinatorServer


@contextlib.asynccontextmanager
async def run_coordinator(
    config: FleetConfig,
    *,
    host: str | None = None,
    port: int | None = None,
    log_dir: Path | None = None,
    origin: str | None = None,
    limits: CoordinatorLimits | None = None,
) -> AsyncIterator[RunningCoordinator]:
    """Launch the fleet's engines, start the coordinator and its HTTP server; stop all on exit.

    `limits` overrides the admission limits read from `config.coordinator`.
    """
    async with launch_fleet(config, log_dir=log_dir) as running:
        fleet = running.fleet(time.monotonic(), config.health.policy())
        coordinator = Coordinator(config, fleet, origin=origin, limits=limits)
        await coordinator.start()
        server = CoordinatorServer(
            create_app(coordinator),
            host if host is not None else config.coordinator.host,
            port if port is not None else config.coordinator.port,
        )
        try:
            url = await server.start()
            yield RunningCoordinator(url, coordinator, running, server)
        finally:
            await server.stop()
            await coordinator.stop()
