"""`disconnect.py`: the callback of a client's disconnect, told by the edge or waited for.

The edge path end to end (real uvicorn + the edge protocol, a client that leaves during the
prefill or mid-stream) is `test_failures.py`'s `test_client_disconnect_*`; here the two ways
one request is watched, and their `stop()`, on the loop with no server: `FakeCycle` stands in
for uvicorn's cycle (its `disconnected` flag and flow control, what `DisconnectWatch` reads).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pdorch.app.disconnect import DISCONNECT_EXTENSION, DisconnectWatch, watch_disconnect
from tests.waiting import async_wait_until


class FakeFlow:
    def __init__(self) -> None:
        self.resumed = 0

    def resume_reading(self) -> None:
        self.resumed += 1


class FakeCycle:
    def __init__(self) -> None:
        self.disconnected = False
        self.flow = FakeFlow()


def _scope(watch: DisconnectWatch | None) -> dict[str, Any]:
    scope: dict[str, Any] = {"type": "http"}
    if watch is not None:
        scope["extensions"] = {DISCONNECT_EXTENSION: watch}
    return scope


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def test_the_edge_watch_calls_back_once_on_loss_and_never_after_stop() -> None:
    cycle = FakeCycle()
    watch = DisconnectWatch(cycle)
    calls: list[str] = []
    got = watch_disconnect(_scope(watch), _never, lambda: calls.append("left"))
    assert got is watch and cycle.flow.resumed == 1  # reading resumed, as receive() does
    cycle.disconnected = True
    watch.lost()
    watch.lost()
    assert calls == ["left"]
    watch.start(lambda: calls.append("again"))
    watch.stop()
    await asyncio.sleep(0)  # the soon-call of an already-disconnected start: stopped first
    watch.lost()
    assert calls == ["left"]


async def test_a_watch_started_after_the_client_left_calls_back_soon() -> None:
    cycle = FakeCycle()
    cycle.disconnected = True
    calls: list[str] = []
    watch_disconnect(_scope(DisconnectWatch(cycle)), _never, lambda: calls.append("left"))
    assert calls == []  # from the loop, not inside start()

    async def called() -> bool:
        return calls == ["left"]

    await async_wait_until(called, 1.0, message="called back")


async def test_without_the_edge_a_task_waits_for_http_disconnect() -> None:
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def receive() -> dict[str, Any]:
        return await messages.get()

    calls: list[str] = []
    watch = watch_disconnect(_scope(None), receive, lambda: calls.append("left"))
    await messages.put({"type": "http.request", "body": b"", "more_body": False})
    await messages.put({"type": "http.disconnect"})

    async def called() -> bool:
        return calls == ["left"]

    await async_wait_until(called, 1.0, message="called back")
    watch.stop()

    stopped: list[str] = []
    watch = watch_disconnect(_scope(None), receive, lambda: stopped.append("left"))
    watch.stop()
    await messages.put({"type": "http.disconnect"})
    for _ in range(3):
        await asyncio.sleep(0)
    assert stopped == [] and messages.qsize() == 1  # its task was cancelled before it read
