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
- `whole answer` (proxy-6): a finished `Response` written through the ASGI path
  (`Response.__call__` → uvicorn's `send()` twice → `HeadCork`) vs the edge's
  `WholeAnswer.send_whole` (`pdorch/app/edge_answer.py`), each on a fresh uvicorn cycle over a
  transport that drops the bytes (the syscall is alike in both and not timed).
- `metrics`: a whole answer's six updates (`answered`, `decode_first_byte`, `routed`,
  `completed`: 2 counter increments, 4 histogram observations) on prometheus_client's
  labelled children vs the loop's (`pdorch/app/loop_metrics.py`), same buckets.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import timeit
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast

import uvloop
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.responses import Response
from uvicorn._types import HTTPScope
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from pdorch.app.disconnect import DisconnectWatch, wait_disconnect
from pdorch.app.edge import HeadCork
from pdorch.app.edge_answer import WholeAnswer
from pdorch.app.loop_metrics import LoopCounter, LoopHistogram

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


class _NullTransport(asyncio.Transport):
    """Drops every write: the syscall is the same on both paths and not what is timed."""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        return None

    def is_closing(self) -> bool:
        return False


_LOG = logging.getLogger("lean_micro")
_DEFAULT_HEADERS = [(b"date", b"Thu, 03 Dec 2026 08:00:00 GMT"), (b"server", b"uvicorn")]
_SCOPE = cast(HTTPScope, {"type": "http", "method": "POST", "path": "/v1/completions"})


def _new_cycle(transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> Any:
    cycle: Any = RequestResponseCycle(
        _SCOPE,
        transport,
        FlowControl(transport),
        _LOG,
        _LOG,
        False,
        _DEFAULT_HEADERS,
        asyncio.Event(),
        False,
        True,
        lambda: None,
    )
    cycle.transport = HeadCork(transport, cycle, loop)  # as the edge sets it
    return cycle


def _whole_answer() -> Response:  # a bench answer's shape: JSON body, the route headers
    return Response(
        b'{"id":"cmpl-1","object":"text_completion","choices":[{"text":"abcd"}]}',
        status_code=200,
        media_type="application/json",
        headers={
            "x-request-id": "pdorch-0123456789abcdef0000000000000001",
            "x-pdorch-prefill": "prefill-0",
            "x-pdorch-decode": "decode-0",
            "x-pdorch-route": "pd",
        },
    )


async def _answer_rows(calls: int) -> tuple[float, float, float]:
    loop = asyncio.get_running_loop()
    transport = _NullTransport()

    async def receive() -> Any:
        raise AssertionError("not read")

    async def bare() -> None:
        _new_cycle(transport, loop)
        _whole_answer()
        await asyncio.sleep(0)  # the cork's flush turn, alike in every row

    async def asgi() -> None:
        cycle = _new_cycle(transport, loop)
        await _whole_answer()(cast(dict[str, Any], _SCOPE), receive, cycle.send)
        await asyncio.sleep(0)

    async def whole() -> None:
        cycle = _new_cycle(transport, loop)
        response = _whole_answer()
        sent = WholeAnswer(cycle, cycle.transport).send_whole(
            response.status_code, response.raw_headers, response.body
        )
        assert sent
        await asyncio.sleep(0)

    rows: list[list[float]] = [[], [], []]
    for _ in range(REPEATS):
        for row, run in zip(rows, (bare, asgi, whole), strict=True):
            row.append(await _time_us(run, calls))
    base, asgi_us, whole_us = (min(row) for row in rows)
    return base, asgi_us, whole_us


_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TOKENS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def _metrics_rows(calls: int) -> tuple[float, float]:
    r = CollectorRegistry(auto_describe=False)
    answered = Counter("a", "a", ["endpoint", "status"], registry=r).labels("chat", "200")
    routes = Counter("b", "b", ["route"], registry=r).labels("pd")
    duration = Histogram("c", "c", ["e"], buckets=_SECONDS, registry=r).labels("chat")
    first = Histogram("d", "d", ["e"], buckets=_SECONDS, registry=r).labels("chat")
    prompt = Histogram("e", "e", ["r"], buckets=_TOKENS, registry=r).labels("pd")
    output = Histogram("f", "f", ["r"], buckets=_TOKENS, registry=r).labels("pd")
    l_answered = LoopCounter("a", "a", ["endpoint", "status"]).labels("chat", "200")
    l_routes = LoopCounter("b", "b", ["route"]).labels("pd")
    l_duration = LoopHistogram("c", "c", ["e"], _SECONDS).labels("chat")
    l_first = LoopHistogram("d", "d", ["e"], _SECONDS).labels("chat")
    l_prompt = LoopHistogram("e", "e", ["r"], _TOKENS).labels("pd")
    l_output = LoopHistogram("f", "f", ["r"], _TOKENS).labels("pd")

    def before() -> None:
        routes.inc()
        prompt.observe(200)
        first.observe(0.004)
        output.observe(4)
        answered.inc()
        duration.observe(0.0045)

    def after() -> None:
        l_routes.inc()
        l_prompt.observe(200)
        l_first.observe(0.004)
        l_output.observe(4)
        l_answered.inc()
        l_duration.observe(0.0045)

    return _min_us(before, calls), _min_us(after, calls)


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
    base, asgi_us, whole_us = uvloop.run(_answer_rows(calls))
    print(
        f"whole answer      before {asgi_us - base:7.2f} us  after {whole_us - base:7.2f} us"
        f"  (over {base:.2f} us: the cycle, the Response, a loop turn)"
    )
    old_metrics, new_metrics = _metrics_rows(calls)
    print(f"metrics           before {old_metrics:7.2f} us  after {new_metrics:7.2f} us")


if __name__ == "__main__":
    main(sys.argv)
