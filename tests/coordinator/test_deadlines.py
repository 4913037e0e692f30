"""`Cut` / `DeadlineQueue` (pdorch/app/deadlines.py): `asyncio.timeout`'s behaviour on one
shared timer per duration."""

from __future__ import annotations

import asyncio

import pytest

from pdorch.app.deadlines import Cut, DeadlineQueue, Deadlines


async def test_a_cut_past_its_deadline_raises_timeout_error_and_clears_our_cancel() -> None:
    queue = Deadlines().queue(0.02)
    cut = Cut(queue)
    task = asyncio.current_task()
    assert task is not None
    with pytest.raises(TimeoutError):
        async with cut:
            await asyncio.sleep(5)
    assert cut.expired()
    assert task.cancelling() == 0
    assert len(queue) == 0


async def test_a_block_that_ends_in_time_is_untouched_and_leaves_nothing_armed() -> None:
    queue = Deadlines().queue(0.05)
    async with Cut(queue) as cut:
        await asyncio.sleep(0)
    assert not cut.expired()
    assert len(queue) == 0
    await asyncio.sleep(0.08)  # the shared timer fires on ended entries only: nothing runs
    assert not cut.expired()


async def test_an_outer_cancel_propagates_as_cancelled_error_not_timeout() -> None:
    queue = Deadlines().queue(0.01)

    async def body() -> None:
        async with Cut(queue):
            await asyncio.sleep(5)

    task = asyncio.create_task(body())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(queue) == 0


async def test_a_deadline_and_an_outer_cancel_together_stay_a_cancel() -> None:
    """As `asyncio.timeout`: our cancel is taken back, the outer one still ends the task."""
    queue = Deadlines().queue(0.01)

    async def body() -> None:
        async with Cut(queue) as cut:
            try:
                await asyncio.sleep(5)
            finally:
                assert cut.expired()
                task = asyncio.current_task()
                assert task is not None
                task.cancel()
                await asyncio.sleep(0)

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(body())


async def test_fire_cuts_a_scope_without_deadline_once_and_not_after_it_ended() -> None:
    cut = Cut(None)
    with pytest.raises(TimeoutError):
        async with cut:
            cut.fire()
            cut.fire()  # once
            await asyncio.sleep(5)
    cut.fire()  # ended: nothing (the task is not cancelled)
    await asyncio.sleep(0)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_deadlines_fire_in_order_each_at_its_own_time_behind_one_timer() -> None:
    loop = asyncio.get_running_loop()
    queue = DeadlineQueue(loop, 0.5)
    fired: list[tuple[int, float]] = []
    both = asyncio.Event()
    start = loop.time()

    def record(i: int) -> None:
        fired.append((i, loop.time() - start))
        if len(fired) == 2:
            both.set()

    first = queue.add(lambda: record(0))
    await asyncio.sleep(0.1)
    late = loop.time() - start
    second = queue.add(lambda: record(1))
    third = queue.add(lambda: record(2))
    queue.cancel(second)
    queue.cancel(second)  # idempotent
    assert len(queue) == 2
    await asyncio.wait_for(both.wait(), 5)
    assert [i for i, _ in fired] == [0, 2]
    assert fired[0][1] >= 0.5 - 0.002 and fired[1][1] >= late + 0.5 - 0.002
    assert len(queue) == 0
    queue.cancel(first)  # fired already: nothing
    queue.cancel(third)
    assert len(queue) == 0


async def test_ended_entries_do_not_pile_up_behind_a_long_one() -> None:
    queue = DeadlineQueue(asyncio.get_running_loop(), 60.0)
    head = queue.add(lambda: None)  # a long request at the head
    for _ in range(10_000):
        queue.cancel(queue.add(lambda: None))
    assert len(queue) == 1
    assert len(queue._entries) <= 2 * 1 + 64 + 1
    queue.cancel(head)


async def test_one_queue_per_duration_and_a_new_loop_starts_afresh() -> None:
    deadlines = Deadlines()
    assert deadlines.queue(1.0) is deadlines.queue(1.0)
    assert deadlines.queue(1.0) is not deadlines.queue(2.0)
    first = deadlines.queue(1.0)
    deadlines._loop = None  # as if the coordinator had moved to another loop
    assert deadlines.queue(1.0) is not first


async def test_a_failing_callback_is_reported_and_the_next_ones_still_fire() -> None:
    loop = asyncio.get_running_loop()
    reported: list[object] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context["exception"]))
    queue = DeadlineQueue(loop, 0.01)
    done = asyncio.Event()

    def boom() -> None:
        raise ValueError("boom")

    queue.add(boom)
    queue.add(done.set)
    await asyncio.wait_for(done.wait(), 5)
    assert [type(e) for e in reported] == [ValueError]
    loop.set_exception_handler(None)
