"""`PeriodicLoop`: the start/stop shell of the fleet's background loops (health, metrics).

One round runs every `interval_s` seconds, measured from the start of the previous round, so
a slow round does not push the schedule further back each time. A round that raises is
dropped (the next round retries): a loop that watches engines must outlive any one engine's
misbehaviour. The rounds themselves (`run_once`) stay plain coroutines that tests call directly.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType
from typing import Self


class PeriodicLoop(ABC):
    """Run `run_once` every `interval_s` seconds between `start()` and `stop()`."""

    interval_s: float
    clock: Callable[[], float]

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    @abstractmethod
    async def run_once(self) -> object:
        """One round."""

    async def _run(self) -> None:
        while True:
            started = self.clock()
            with contextlib.suppress(Exception):
                await self.run_once()
            await asyncio.sleep(max(0.0, self.interval_s - (self.clock() - started)))

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
