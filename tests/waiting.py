"""Polling with a deadline: tests wait on conditions, never on fixed sleeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

T = TypeVar("T")

# A condition answers the value it waited for, or a falsy "not yet" (None or False). Typing
# "not yet" as exactly `None | Literal[False]` lets the truthiness check narrow it away, so the
# value returned is the condition's `T` (a `bool` condition gives `True`).
Pending = None | Literal[False]


def wait_until(
    condition: Callable[[], T | Pending],
    timeout: float,
    interval: float = 0.02,
    message: str = "condition",
) -> T:
    """Poll `condition` until it returns a truthy value; return that value.

    Raises TimeoutError naming `message` when `timeout` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {message}")
        time.sleep(interval)


async def async_wait_until(
    condition: Callable[[], Awaitable[T | Pending]],
    timeout: float,  # noqa: ASYNC109  (a polling deadline, not a cancellation scope)
    interval: float = 0.02,
    message: str = "condition",
) -> T:
    """Async twin of `wait_until` for conditions that must be awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {message}")
        await asyncio.sleep(interval)
