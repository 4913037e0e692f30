"""The background work of a live actuator: starts, drains and moves run as tasks, so `scale()`
answers at once while replicas come and go; `idle()` waits for them (tests, `--once`), and
`cancel()` stops what is left at shutdown. One implementation for every actuator, so they wait
and shut down alike."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine


class BackgroundWork:
    """The set of running tasks; a task leaves it when it ends."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[object, object, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def idle(self, timeout_s: float) -> None:
        """Wait until every task has ended, those spawned while waiting too (a drain can spawn
        the stop that follows it). A task's exception is its own to record: it is not raised."""
        async with asyncio.timeout(timeout_s):
            while self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def cancel(self) -> None:
        """Cancel every task and wait for them to unwind."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
