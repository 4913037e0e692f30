"""`pools.inloop_server.InLoopHttpServer` on a loop of its own in a thread, for sync fixtures.

A module-scoped fixture outlives each async test's event loop, so a test server that several
tests share runs its own loop in a daemon thread; the server itself is the product's one
in-loop helper (port 0, bound before serving; bounded stop).

    with ThreadedHttpServer(app) as server:
        server.url                   # "http://127.0.0.1:<port>"
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType
from typing import Any

from pools.inloop_server import InLoopHttpServer

START_TIMEOUT_S = 30.0


class ThreadedHttpServer:
    def __init__(self, app: Any, host: str = "127.0.0.1") -> None:
        self._server = InLoopHttpServer(app, host, 0)
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="test-http-server", daemon=True)

    @property
    def url(self) -> str:
        assert self._server.url is not None, "server not started"
        return self._server.url

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            await self._server.start()
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            await self._server.stop()

    def __enter__(self) -> ThreadedHttpServer:
        self._thread.start()
        if not self._started.wait(START_TIMEOUT_S):
            raise TimeoutError(f"test HTTP server not serving within {START_TIMEOUT_S:.0f}s")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(self._server.stop_deadline_s + 5.0)
