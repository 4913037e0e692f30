"""The running requests' pass of a step, with preemption by recompute (vLLM v1's first pass).

Running requests are taken in order while the token budget lasts. Each gets
`min(num_tokens - num_computed, budget, max_model_len - 1 - num_computed)` tokens: a decode
gets 1, a prefill its next chunk (chunked prefill). If its new blocks do not fit, the *last*
running request is preempted until they fit or the request itself was the one preempted:
its blocks are freed, its progress dropped (it recomputes from scratch when admitted again),
it goes back to the *head* of `waiting`, and if it was already scheduled in this step its
tokens return to the budget. Blocks are cached (`BlockStored`) as they are allocated for
tokens being computed, full blocks only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pools.sim.request import Request, RequestStatus

if TYPE_CHECKING:
    from pools.sim.scheduler import Scheduler


def schedule_running(
    sched: Scheduler,
    budget: int,
    scheduled: list[tuple[Request, int]],
    sched_index: dict[str, int],
) -> tuple[int, int]:
    """Schedule the running requests into the step being built (module docstring); returns
    `(token budget left, requests preempted)`."""
    num_preempted = 0
    bs = sched.block_size
    kv = sched.kv_cache_manager
    free_q = kv.block_pool.free_block_queue
    caching = sched.config.enable_prefix_caching
    max_len_m1 = sched.config.max_model_len - 1
    running = sched.running
    i = 0
    while i < len(running) and budget > 0:
        r = running[i]
        c = r.num_computed_tokens
        n = r.num_tokens - c
        if n > budget:
            n = budget
        if n > max_len_m1 - c:
            n = max_len_m1 - c
        if n <= 0:
            i += 1
            continue
        need = -(-(c + n) // bs) - len(r.blocks)  # ceil division inlined: once per request
        self_preempted = False
        while need > free_q.num_free_blocks:
            victim = running.pop()
            num_preempted += 1
            if victim.request_id in sched_index:
                budget += _unschedule(victim, scheduled, sched_index)
            preempt(sched, victim)
            if victim is r:
                self_preempted = True
                break
        if self_preempted:
            break
        if need > 0:
            kv.allocate_new_blocks(r, need)
        if caching and (c + n) // bs > r.num_cached_blocks:
            kv.cache_blocks(r, c + n)
        sched_index[r.request_id] = len(scheduled)
        scheduled.append((r, n))
        budget -= n
        i += 1
    return budget, num_preempted


def preempt(sched: Scheduler, r: Request) -> None:
    """Free `r`'s blocks and drop its progress; it waits at the head of the queue."""
    sched.kv_cache_manager.free(r)
    r.num_computed_tokens = 0
    r.status = RequestStatus.PREEMPTED
    r.num_preemptions += 1
    sched.counters.num_preemptions += 1
    sched.waiting.appendleft(r)


def _unschedule(
    r: Request, scheduled: list[tuple[Request, int]], sched_index: dict[str, int]
) -> int:
    """Take `r` out of this step's schedule; returns the tokens it had."""
    idx = sched_index.pop(r.request_id)
    n = scheduled[idx][1]
    del scheduled[idx]
    for j in range(idx, len(scheduled)):
        sched_index[scheduled[j][0].request_id] = j
    return n
