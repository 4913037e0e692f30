"""Microbenchmarks of proxy-lean-5's cuts on the whole-answer path (`benchmarks/results/proxy.md`).

    python -m benchmarks.proxy.lean_micro [CALLS]

Each row times the way the hot path did it before a cut and the way it does it after, in
the same process, µs per request, min of 5 repeats of CALLS (default 20,000; the loop rows on
uvloop, taking turns repeat by repeat):

- `request id`: `pdorch-` + `uuid4().hex` per request vs the coordinator's prefix + counter
  (`Coordinator.new_request_id`).
- `disconnect watch`: a task waiting in `receive()` for `http.disconnect` (started, stepped
  into its wait, cancelled and unwound) vs the edge's `DisconnectWatch` (`start` + `stop`,
  `pdorch/app/disconnect.py`), each around one request's worth of loop turns.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import timeit
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop

from pdorch.app.disconnect import DisconnectWatch, wait_disconnect

REPEATS = 5


class _Flow:
    def resume_reading(self) -> None:
        return None


class _Cycle:
    """What `DisconnectWatch` reads of uvicorn's cycle."""

    def __init__(self) -> None:
        self.disconnected = False
        self.flow = _Flow()
        self.event = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.event.wait()  # never set: the client stays
        return {"type": "http.disconnect"}


def _min_us(run: Callable[[], object], calls: int) -> float:
    return min(timeit.repeat(run, number=calls, repeat=REPEATS)) / calls * 1e6


async def _time_us(run: Callable[[], Awaitable[None]], calls: int) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    for _ in range(calls):
        await run()
    return (loop.time() - start) / calls * 1e6


async def _disconnect_rows(calls: int) -> tuple[float, float, float]:
    cycle = _Cycle()

    def left() -> None:
        return None

    async def turn() -> None:  # the request's own work: one loop turn, alike in all rows
        await asyncio.sleep(0)

    async def bare() -> None:
        await turn()
        await asyncio.sleep(0)

    async def with_task() -> None:
        def done(watcher: asyncio.Future[None]) -> None:
            if not watcher.cancelled() and watcher.exception() is None:
                left()

        watcher = asyncio.ensure_future(wait_disconnect(cycle.receive))
        watcher.add_done_callback(done)
        await turn()
        watcher.remove_done_callback(done)
        watcher.cancel()
        await asyncio.sleep(0)  # the cancelled task's unwinding step (the loop runs it anyway)

    async def with_watch() -> None:
        watch = DisconnectWatch(cycle)
        watch.start(left)
        await turn()
        watch.stop()
        await asyncio.sleep(0)  # the same loop turns as the task row

    rows: list[list[float]] = [[], [], []]
    for _ in range(REPEATS):  # the rows take turns: a load swing hits all three alike
        for row, run in zip(rows, (bare, with_task, with_watch), strict=True):
            row.append(await _time_us(run, calls))
    base, task_us, watch_us = (min(row) for row in rows)
    return base, task_us, watch_us


def main(argv: list[str]) -> None:
    calls = int(argv[1]) if len(argv) > 1 else 20_000
    prefix = f"pdorch-{uuid.uuid4().hex[:16]}"
    counter = itertools.count()
    old_id = _min_us(lambda: f"pdorch-{uuid.uuid4().hex}", calls)
    new_id = _min_us(lambda: f"{prefix}{next(counter):016x}", calls)
    print(f"request id        before {old_id:7.2f} us  after {new_id:7.2f} us")
    base, task_us, watch_us = uvloop.run(_disconnect_rows(calls))  # the server's loop
    print(
        f"disconnect watch  before {task_us - base:7.2f} us  after {watch_us - base:7.2f} us"
        f"  (over {base:.2f} us of loop turns)"
    )


if __name__ == "__main__":
    main(sys.argv)
