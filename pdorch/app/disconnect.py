"""A client's disconnect, as a callback: told by pdorch's edge, else waited for in `receive()`.

While a request's legs run (`flow.RequestFlow._race`) and while a stream is relayed
(`proxy_stream.ProxyStream`), a client that leaves must cancel the work at once. The ASGI way
is a task per request that waits in `receive()` for `http.disconnect`: a task created, two
steps, a cancel and its unwinding per request, for an event that almost never comes
(proxy-lean-5, `benchmarks/results/proxy.md`).

pdorch's edge (`edge.py`, the protocol `pdorch serve` runs) knows the moment the connection
is lost: it gives every request a `DisconnectWatch` in the ASGI scope's extensions
(`scope["extensions"]["pdorch.disconnect"]`, the ASGI spec's place for server extensions) and
calls it from `connection_lost`, exactly when uvicorn marks the request disconnected (its
answer not complete). `watch_disconnect` uses it when present and falls back to the task under
any other server. Either way the callback runs at most once, from the event loop, and never
after `stop()`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.types import Receive, Scope

DISCONNECT_EXTENSION = "pdorch.disconnect"


class DisconnectWatch:
    """One request's disconnect, from the edge (module docstring). `cycle`: uvicorn's
    `RequestResponseCycle` of the request (its `disconnected` flag and flow control)."""

    __slots__ = ("_callback", "_cycle")

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle
        self._callback: Callable[[], None] | None = None

    def start(self, callback: Callable[[], None]) -> None:
        """Call `callback` when the client leaves (soon, if it has left already)."""
        cycle = self._cycle
        self._callback = callback
        if cycle.disconnected:
            asyncio.get_running_loop().call_soon(self.lost)
            return
        # as uvicorn's receive() does before it waits: a connection whose reading was paused
        # (a pipelined request behind this one) must be read to see the client leave
        cycle.flow.resume_reading()

    def stop(self) -> None:
        self._callback = None

    def lost(self) -> None:
        """The edge: the connection is gone with this request's answer not complete."""
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()


async def wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class _TaskWatch:
    """The fallback under any ASGI server: a task waits in `receive()` for `http.disconnect`."""

    __slots__ = ("_callback", "_task")

    def __init__(self, receive: Receive, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._task = asyncio.ensure_future(wait_disconnect(receive))
        self._task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[None]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._callback()

    def stop(self) -> None:
        self._task.remove_done_callback(self._done)
        self._task.cancel()


Watch = DisconnectWatch | _TaskWatch


def watch_disconnect(scope: Scope, receive: Receive, callback: Callable[[], None]) -> Watch:
    """Call `callback` once when the client leaves, until `.stop()` (module docstring)."""
    extensions = scope.get("extensions")
    watch = extensions.get(DISCONNECT_EXTENSION) if extensions else None
    if isinstance(watch, DisconnectWatch):
        watch.start(callback)
        return watch
    return _TaskWatch(receive, callback)
