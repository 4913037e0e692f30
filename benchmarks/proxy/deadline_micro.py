"""Microbenchmark of proxy-7's deadlines (`pdorch/app/deadlines.py`), µs per request.

    python -m benchmarks.proxy.deadline_micro [CALLS]

One request's three deadline scopes as the whole-answer path runs them (the request's
`request_timeout_s`, the prefill leg's `prefill_timeout_s`, the first-byte wait's give-up scope
without a deadline), each around one loop turn (`asyncio.sleep(0)`), on uvloop: before,
`asyncio.timeout(600)`, `asyncio.timeout(60)`, `asyncio.timeout(None)`; after, `Cut` on the
shared queues of those durations and `Cut(None)`. Min of 5 repeats of CALLS (default 20,000),
the two taking turns repeat by repeat; a row of the bare loop turns is the floor both share.
And the edge's two per-request deadlines (`edge.py`: headers, then body; arm, re-arm, disarm)
as `loop.call_later` + `cancel` (before) vs `DeadlineQueue` entries (after), no loop turn.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import uvloop

from pdorch.app.deadlines import Cut, Deadlines

REPEATS = 5


async def _bare() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def _before() -> None:
    async with asyncio.timeout(600.0):
        async with asyncio.timeout(60.0):
            await asyncio.sleep(0)
        async with asyncio.timeout(None):
            await asyncio.sleep(0)
        await asyncio.sleep(0)


def _after(deadlines: Deadlines) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        async with Cut(deadlines.queue(600.0)):
            async with Cut(deadlines.queue(60.0)):
                await asyncio.sleep(0)
            async with Cut(None):
                await asyncio.sleep(0)
            await asyncio.sleep(0)

    return run


async def _time_us(run: Callable[[], Awaitable[None]], calls: int) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    for _ in range(calls):
        await run()
    return (loop.time() - start) / calls * 1e6


async def _rows(calls: int) -> dict[str, float]:
    after = _after(Deadlines())
    best = {
        "loop turns only": float("inf"),
        "asyncio.timeout x3": float("inf"),
        "Cut x3": float("inf"),
    }
    for _ in range(REPEATS):
        for name, run in (
            ("loop turns only", _bare),
            ("asyncio.timeout x3", _before),
            ("Cut x3", after),
        ):
            best[name] = min(best[name], await _time_us(run, calls))
    return best


def _noop() -> None:
    return None


async def _edge_rows(calls: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines()

    def before() -> None:
        header = loop.call_later(10.0, _noop)
        header.cancel()
        body = loop.call_later(60.0, _noop)
        body.cancel()

    def after() -> None:
        queue = deadlines.queue(10.0)
        queue.cancel(queue.add(_noop))
        queue = deadlines.queue(60.0)
        queue.cancel(queue.add(_noop))

    best = {"edge call_later x2": float("inf"), "edge queues x2": float("inf")}
    for _ in range(REPEATS):
        for name, run in (("edge call_later x2", before), ("edge queues x2", after)):
            start = loop.time()
            for _ in range(calls):
                run()
            best[name] = min(best[name], (loop.time() - start) / calls * 1e6)
    return best


def main(argv: list[str]) -> None:
    calls = int(argv[0]) if argv else 20_000
    rows = uvloop.run(_rows(calls))
    rows.update(uvloop.run(_edge_rows(calls)))
    for name, us in rows.items():
        print(f"{name:20s} {us:6.2f} µs/request")
    print(f"saved (flow): {rows['asyncio.timeout x3'] - rows['Cut x3']:.2f} µs/request")
    print(f"saved (edge): {rows['edge call_later x2'] - rows['edge queues x2']:.2f} µs/request")


if __name__ == "__main__":
    main(sys.argv[1:])
