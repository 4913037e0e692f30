"""One way to serve an ASGI app with uvicorn on the event loop that is already running.

The coordinator (`pdorch.app.server`), every in-process simulated engine (`pools.sim.server`)
and the benchmarks all serve this way: many servers share one loop and one process, so
uvicorn must not own the loop, the signals or the port choice.

```python
server = InLoopHttpServer(app, host="127.0.0.1", port=0)
url = await server.start()   # bound and accepting: server.port is the OS's pick for port 0
...
await server.stop()          # stop accepting, let open requests finish, then cancel (deadline)
# or: async with InLoopHttpServer(app) as server: ...
```

Contract:
- `start()` binds the socket itself (so `port=0` never races another start for a "free"
  port), starts uvicorn on the running loop and returns once uvicorn accepts connections; a
  bind error (`OSError`) or a start-up failure is raised from `start()`, nothing keeps running.
- `stop()` is idempotent and bounded: uvicorn stops accepting, closes idle keep-alive
  connections, waits up to `graceful_shutdown_s` for open requests (streams) to finish and
  cancels them after that; if uvicorn is still not done `stop_deadline_s` after the stop began,
  its task is cancelled. `request_stop()` is the first half alone, for an owner that must end
  its own streams (the simulated engine aborts its requests) before waiting.
- Signals stay with the host: uvicorn's own handlers would swap SIGINT/SIGTERM per server and
  re-raise them on exit, wrong with many servers in a process (`pdorch serve` also stops
  engines on Ctrl-C).

It lives in `pools/` because that is the lowest layer allowed to speak HTTP (`transfer/` must
not, docs/CONVENTIONS.md) and both `pools.sim` and `pdorch.app` may import `pools`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)

# uvicorn's idle keep-alive default; clients keep theirs below it (pdorch/app/upstream.py).
DEFAULT_KEEP_ALIVE_S = 5


def _server_class() -> type[Any]:
    """A uvicorn.Server that leaves signals to the host and reports readiness as an event."""
    import uvicorn  # imported here: `pdorch --help` must not pay for it

    class _InLoopServer(uvicorn.Server):
        ready: asyncio.Event

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                self.ready.set()

    return _InLoopServer


def _bind(host: str, port: int, backlog: int, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted connections only then; without it
    # Nagle + delayed ACKs hold streamed tokens back ~40 ms.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:  # several processes listen on one port; the kernel spreads connections
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def base_url(host: str, port: int) -> str:
    """The URL a client on this host uses: a wildcard bind is reached on loopback."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


class InLoopHttpServer:
    """uvicorn serving `app` on the running event loop (see the module docstring).

    Parameters (defaults in brackets): `host` ["127.0.0.1"]; `port` [0: the OS picks];
    `backlog` [2048] pending connections; `keep_alive_s` [5] idle keep-alive before uvicorn
    closes a connection; `graceful_shutdown_s` [1] how long `stop()` lets open requests finish;
    `stop_deadline_s` [graceful_shutdown_s + 2] when `stop()` cancels uvicorn outright;
    `http` ["auto"] uvicorn's HTTP protocol: a name or an `asyncio.Protocol` class (the
    coordinator's connection limits, `pdorch/app/edge.py`); `reuse_port` [False] binds with
    `SO_REUSEPORT` (`pdorch serve --workers N`: N processes, one port, `pdorch/app/workers.py`);
    `proxy_headers` [False] uvicorn's `ProxyHeadersMiddleware`: off, because nothing served
    here reads the client address it rewrites (from `X-Forwarded-For` sent by 127.0.0.1 only;
    the scheme it also rewrites shows only in FastAPI's trailing-slash redirects), and it
    wraps every request in one more ASGI call (~2-7 µs per request, proxy-6 in
    `benchmarks/results/proxy.md`).
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        backlog: int = 2048,
        keep_alive_s: int = DEFAULT_KEEP_ALIVE_S,
        graceful_shutdown_s: int = 1,
        stop_deadline_s: float | None = None,
        http: Any = "auto",
        reuse_port: bool = False,
        proxy_headers: bool = False,
    ) -> None:
        self.app = app
        self.proxy_headers = proxy_headers
        self.reuse_port = reuse_port
        self.host = host
        self.requested_port = port
        self.backlog = backlog
        self.keep_alive_s = keep_alive_s
        self.graceful_shutdown_s = graceful_shutdown_s
        self.http = http
        self.stop_deadline_s = (
            stop_deadline_s if stop_deadline_s is not None else graceful_shutdown_s + 2.0
        )
        self.port: int | None = None
        self.url: str | None = None
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None

    @property
    def serving(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> str:
        """Bind, serve, and return the base URL once uvicorn accepts connections."""
        import uvicorn

        if self._task is not None:
            raise RuntimeError("InLoopHttpServer.start() called twice")
        sock = _bind(self.host, self.requested_port, self.backlog, self.reuse_port)
        self._sock = sock
        config = uvicorn.Config(
            self.app,
            # http="auto" (the default): httptools' C parser when installed, else h11
            http=self.http,
            # asyncio's (and uvloop's) create_server calls listen() again on the socket it is
            # given, with this backlog: without it uvicorn's 2048 replaced `backlog` silently
            backlog=self.backlog,
            log_level="warning",
            access_log=False,
            lifespan="off",
            proxy_headers=self.proxy_headers,
            timeout_keep_alive=self.keep_alive_s,
            timeout_graceful_shutdown=self.graceful_shutdown_s,
        )
        server = _server_class()(config)
        server.ready = asyncio.Event()
        self._server = server
        self._task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        ready = asyncio.get_running_loop().create_task(server.ready.wait())
        try:
            await asyncio.wait({ready, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if not server.ready.is_set():
            task, self._task = self._task, None
            self._close_socket()
            await task  # re-raises the start-up error, if it was one
            raise RuntimeError(f"HTTP server on {self.host}:{self.requested_port} exited at start")
        self.port = int(sock.getsockname()[1])
        self.url = base_url(self.host, self.port)
        return self.url

    def request_stop(self) -> None:
        """Ask uvicorn to stop accepting and wind down; returns at once."""
        if self._server is not None:
            self._server.should_exit = True

    async def stop(self) -> None:
        """Stop serving within `stop_deadline_s` (idempotent; safe after a failed start)."""
        self.request_stop()
        task, self._task = self._task, None
        if task is not None:
            done, _ = await asyncio.wait({task}, timeout=self.stop_deadline_s)
            if not done:
                self._server.force_exit = True
                task.cancel()
                await asyncio.wait({task})
            if not task.cancelled() and task.exception() is not None:
                # a server that failed while serving has nothing left to stop; say so once
                log.warning("HTTP server on %s ended with %r", self.url, task.exception())
        self._close_socket()

    def _close_socket(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def __aenter__(self) -> InLoopHttpServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
