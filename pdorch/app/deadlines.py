"""Cheap deadlines for the request path: `Cut`, an `asyncio.timeout` whose timer is shared.

Why (proxy.md, proxy-6's profile): a whole answer ran three `asyncio.timeout`s (the request's
`request_timeout_s`, the prefill leg's `prefill_timeout_s`, the first-byte wait's give-up
scope), ~5 % of the coordinator's CPU per request: each arms and cancels its own loop timer
(`loop.call_at`: a timer handle, a heap push, a cancel) and reschedules it on entry.

Here every deadline of one duration sits in one FIFO (`DeadlineQueue`: a fixed duration and a
monotonic clock keep it sorted), behind **one** loop timer armed at its head's time and
re-armed only when it fires: a deadline costs an append and a flag on exit. When the timer
fires, it drops the ended entries at the head, fires the due ones (each cancels its task, as
`asyncio.timeout` does), and re-arms at the first one still waiting. Ended entries are also
dropped from the head on each `add`, and the FIFO is compacted when ended entries outnumber the
live ones (a long request at the head must not keep every later ended one alive).

The edge's per-request header and body deadlines (`edge.py`, two per request, were a
`loop.call_later` each) are entries in such queues too.

`Cut(queue)` is the context manager: `asyncio.timeout`'s contract as the flow uses it (Python
3.11's `asyncio.timeouts.Timeout`): on expiry the task is cancelled; on exit, when the cut
fired and the block ended in `CancelledError` that was ours alone (`uncancel()` back to the
count on entry), `TimeoutError` is raised from it; any other cancel propagates. `Cut(None)`
has no deadline and fires only on `fire()` (the first-byte wait's give-up: was
`asyncio.timeout(None)` + `reschedule(0)`). `expired()` says whether it fired.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from types import TracebackType

# Compact the FIFO when it holds more than this many entries per live one (plus a floor).
_COMPACT_RATIO = 2
_COMPACT_FLOOR = 64


class Deadline:
    """One deadline in a `DeadlineQueue` (`callback` None: ended or fired)."""

    __slots__ = ("callback", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback: Callable[[], None] | None = callback


class DeadlineQueue:
    """Deadlines of one duration on one loop, behind one timer (module docstring)."""

    __slots__ = ("_entries", "_handle", "_live", "_loop", "duration_s")

    def __init__(self, loop: asyncio.AbstractEventLoop, duration_s: float) -> None:
        self._loop = loop
        self.duration_s = duration_s
        self._entries: deque[Deadline] = deque()
        self._live = 0
        self._handle: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        """Deadlines still waiting."""
        return self._live

    def add(self, callback: Callable[[], None]) -> Deadline:
        """`callback()` runs `duration_s` from now unless `cancel(entry)` comes first."""
        entries = self._entries
        while entries and entries[0].callback is None:
            entries.popleft()
        entry = Deadline(self._loop.time() + self.duration_s, callback)
        entries.append(entry)
        self._live += 1
        if self._handle is None:
            self._handle = self._loop.call_at(entry.when, self._fire)
        elif len(entries) > _COMPACT_RATIO * self._live + _COMPACT_FLOOR:
            self._entries = deque(e for e in entries if e.callback is not None)
        return entry

    def cancel(self, entry: Deadline) -> None:
        """The deadline is no longer needed (its callback will not run); idempotent."""
        if entry.callback is not None:
            entry.callback = None
            self._live -= 1

    def _fire(self) -> None:
        self._handle = None
        entries = self._entries
        now = self._loop.time()
        while entries:
            entry = entries[0]
            callback = entry.callback
            if callback is None:
                entries.popleft()
                continue
            if entry.when > now:
                self._handle = self._loop.call_at(entry.when, self._fire)
                return
            entries.popleft()
            entry.callback = None
            self._live -= 1
            try:
                callback()
            except Exception as exc:  # as the loop does for a timer's callback: report, go on
                self._loop.call_exception_handler(
                    {"message": "deadline callback failed", "exception": exc}
                )


class Deadlines:
    """The coordinator's `DeadlineQueue`s: one per (loop, duration), made on first use."""

    __slots__ = ("_loop", "_queues")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[float, DeadlineQueue] = {}

    def queue(self, duration_s: float) -> DeadlineQueue:
        """The queue of `duration_s` on the running loop."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (tests run one per case): start afresh
            self._loop = loop
            self._queues = {}
        found = self._queues.get(duration_s)
        if found is None:
            found = self._queues[duration_s] = DeadlineQueue(loop, duration_s)
        return found


class Cut:
    """`asyncio.timeout` on a shared `DeadlineQueue` (module docstring); `Cut(None)`: no
    deadline, `fire()` only. One use."""

    __slots__ = ("_cancelling", "_done", "_entry", "_fired", "_queue", "_task")

    def __init__(self, queue: DeadlineQueue | None) -> None:
        self._queue = queue
        self._task: asyncio.Task[object] | None = None
        self._entry: Deadline | None = None
        self._cancelling = 0
        self._fired = False
        self._done = False

    def expired(self) -> bool:
        """Whether the deadline passed (or `fire()` ran) inside the block."""
        return self._fired

    def fire(self) -> None:
        """Cut the block now (the task is cancelled; the block's exit raises `TimeoutError`).
        Nothing once the block has ended or the cut fired."""
        if self._fired or self._done or self._task is None:
            return
        self._fired = True
        self._task.cancel()

    async def __aenter__(self) -> Cut:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Cut must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        if self._queue is not None:
            self._entry = self._queue.add(self.fire)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done = True
        if self._entry is not None:
            assert self._queue is not None
            self._queue.cancel(self._entry)
            self._entry = None
        if self._fired:
            assert self._task is not None
            # as Python 3.11's Timeout: our cancel is taken back; TimeoutError only when the
            # block ended in it and no other cancel is pending
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc
