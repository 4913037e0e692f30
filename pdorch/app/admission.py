"""Bounded admission: at most `max_concurrent_requests` client requests in flight, a bounded
queue of waiters ordered by priority, the rest shed at once with 429 + `Retry-After`.

Policy (`AdmissionQueue.offer`, pure: no clock, no I/O; the caller passes `now`):
- a free slot and nobody queued → admitted at once;
- else, with fewer than `max_queue` waiters → queued;
- else, the queue is full: a newcomer whose priority is higher than the lowest queued one takes
  that one's place (the lowest, latest-arrived waiter is shed: 429 `displaced`), otherwise the
  newcomer is shed (429 `concurrency`).
- a released slot goes to the queued waiter with the highest priority, earliest arrival first
  (FIFO within a priority);
- a waiter still queued `max_wait_s` after it arrived is shed (429 `queue_timeout`): a client
  is better told to come back than held past the point its answer is useful.

Priority: the integer in the request header `x-pdorch-priority` (larger = more important;
clamped to [-100, 100]; missing or not an integer = 0).

Parameters (fleet file `coordinator:`): `max_concurrent_requests` (None: no limit, nothing is
queued or shed); `admission.max_queue` (default 0: no queue, over the limit is shed at once,
the behaviour before the queue existed); `admission.max_wait_s` (default 5 s);
`admission.retry_after_s` (default 1 s, the `Retry-After` of every 429 it sends).

Memory: at most `max_concurrent_requests + max_queue` requests are held (their bodies are read
only once admitted), so a burst of any size costs one small answer per shed request.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from pdorch.config.fleet import CoordinatorSettings

PRIORITY_HEADER = "x-pdorch-priority"
MAX_PRIORITY = 100

Decision = Literal["admit", "queue", "shed"]
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class CoordinatorLimits:
    """Request admission limits.

    `max_body_bytes`: larger bodies get 413 (default 32 MiB: a 128k-token prompt as text is
    ~0.5 MB, so this only stops abuse). `max_concurrent_requests`: requests in flight beyond
    it wait in a queue of `max_queue` (by priority, up to `max_wait_s`) or get 429 with
    `Retry-After: retry_after_s` (None: unlimited; the policy: `admission.py`). Read from the
    fleet file's `coordinator:` block (`CoordinatorSettings`, same names and defaults).
    """

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_concurrent_requests: int | None = None
    max_queue: int = 0
    max_wait_s: float = 5.0
    retry_after_s: int = 1

    @classmethod
    def from_settings(cls, settings: CoordinatorSettings) -> CoordinatorLimits:
        return cls(
            max_body_bytes=settings.max_body_bytes,
            max_concurrent_requests=settings.max_concurrent_requests,
            max_queue=settings.admission.max_queue,
            max_wait_s=settings.admission.max_wait_s,
            retry_after_s=settings.admission.retry_after_s,
        )


def parse_priority(value: str | None) -> int:
    """The header's priority: an integer clamped to [-100, 100]; 0 when missing or bad."""
    if value is None:
        return 0
    try:
        priority = int(value.strip())
    except ValueError:
        return 0
    return max(-MAX_PRIORITY, min(MAX_PRIORITY, priority))


@dataclass(order=True, slots=True)
class Waiter:
    """One queued request; sorts by (higher priority first, earlier arrival first)."""

    key: tuple[int, int]
    priority: int = field(compare=False)
    arrived: float = field(compare=False)
    future: asyncio.Future[None] | None = field(default=None, compare=False)


@dataclass(slots=True)
class AdmissionQueue:
    """Slots and waiters (the pure part; `Admission` waits on it)."""

    limit: int | None
    max_queue: int
    in_flight: int = 0
    waiters: list[Waiter] = field(default_factory=list)  # kept sorted, best first
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    def offer(self, priority: int, now: float) -> tuple[Decision, Waiter | None, Waiter | None]:
        """(decision, the new waiter when queued, a waiter displaced by it when any)."""
        if self.limit is None or (self.in_flight < self.limit and not self.waiters):
            self.in_flight += 1
            return "admit", None, None
        waiter = Waiter((-priority, next(self._seq)), priority, now)
        if len(self.waiters) < self.max_queue:
            bisect.insort(self.waiters, waiter)
            return "queue", waiter, None
        if self.waiters and self.waiters[-1].priority < priority:
            displaced = self.waiters.pop()
            bisect.insort(self.waiters, waiter)
            return "queue", waiter, displaced
        return "shed", None, None

    def release(self) -> Waiter | None:
        """A slot is free: the waiter it goes to (its slot already counted), or None."""
        if self.waiters:
            return self.waiters.pop(0)
        self.in_flight = max(0, self.in_flight - 1)
        return None

    def leave(self, waiter: Waiter) -> bool:
        """A waiter gives up (deadline, client gone); False when it was not queued."""
        try:
            self.waiters.remove(waiter)
        except ValueError:
            return False
        return True


class Shed(Exception):
    """A request not admitted; `reason`: `concurrency` (over the limit, the queue full or
    off), `displaced` (queued, then its place taken by a higher priority) or `queue_timeout`
    (queued past `max_wait_s`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True)
class Admission:
    """The queue with asyncio waiting: `await acquire(priority, now)`, then `release()`."""

    queue: AdmissionQueue
    max_wait_s: float

    @property
    def in_flight(self) -> int:
        return self.queue.in_flight

    @property
    def queued(self) -> int:
        return len(self.queue.waiters)

    async def acquire(self, priority: int, now: float) -> None:
        """Return once admitted; raise Shed when the request is not."""
        decision, waiter, displaced = self.queue.offer(priority, now)
        if displaced is not None and displaced.future is not None:
            displaced.future.set_exception(Shed("displaced"))
        if decision == "admit":
            return
        if decision == "shed" or waiter is None:
            raise Shed("concurrency")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter.future = future
        try:
            await asyncio.wait_for(asyncio.shield(future), self.max_wait_s)
        except TimeoutError:
            if self.queue.leave(waiter):
                raise Shed("queue_timeout") from None
            # no longer queued: it left the queue while the deadline struck (`wait_for` yields
            # once after its timeout), handed a slot (keep it) or displaced by a higher
            # priority (its future holds the Shed: counting it admitted would take a slot
            # nobody gave it, one over `max_concurrent_requests`, seen in `overload-mixed`)
            displaced_by = future.exception() if future.done() else None
            if displaced_by is not None:
                raise displaced_by from None
        except asyncio.CancelledError:
            if not self.queue.leave(waiter) and future.done() and future.exception() is None:
                self.release()  # handed a slot, then the client left: pass it on
            raise

    def release(self) -> None:
        """One admitted request is done: its slot goes to the best waiter, or is freed."""
        waiter = self.queue.release()
        # a queued waiter's future is set in `acquire` before it can be released (no await in
        # between) and settled only when it leaves the queue, so it is pending here
        if waiter is not None and waiter.future is not None:
            waiter.future.set_result(None)
