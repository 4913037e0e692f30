"""Planning a stretch of identical pure-decode steps (the scheduler's fast-forward mode).

Why: a fleet simulator replaying an hour of traffic on 16 replicas runs millions of decode
steps (~20 ms each); at ~30 us of Python per engine step that alone takes minutes. Between two
events that can change a replica's batch (an arrival, a finish, a KV transfer, a lease expiry),
its decode steps differ only in how long each takes (every sequence's context grows by one token
per step), so they can be planned at once and applied in one call
(`Scheduler.fast_forward_decode`, which checks the batch is pure decode first).

This module only reads the running requests and returns the plan; the scheduler applies it.
The stretch stops before: the step that would finish a request (`max_tokens`, `max_model_len`;
that step runs as a normal step with its full outputs), the first block allocation that would
not fit (a normal step preempts there), a step that would start at or after a lease expiry, a
step that would end after `until`, and `max_steps`.

Equivalence: the plan lists block allocations (with their evictions) and block caching in
exactly the order the per-step scheduler runs them (step by step, running order, allocate
before cache), step durations come from the same `step_time` with the same arguments; so state,
KV events and timings equal stepping one by one (`tests/pools/sim/test_fast_forward.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pools.sim.request import Request

BlockOp = tuple[int, int, int]
"""(step j, index in the running list, 0 = allocate one block / 1 = cache up to token j+1)."""


def plan_decode_stretch(
    running: Sequence[Request],
    *,
    start: float,
    until: float,
    lease_expiry: float,
    max_steps: int | None,
    max_model_len: int,
    block_size: int,
    caching: bool,
    num_free_blocks: int,
    step_time: Callable[..., float],
) -> tuple[list[float], list[BlockOp]] | None:
    """The step end times and the block operations of the stretch; None if no step fits."""
    s = len(running)
    k_max = max_steps if max_steps is not None else 1 << 62
    for r in running:
        # The step producing output max_tokens (or reaching max_model_len) finishes r.
        left = min(r.max_tokens - r.num_output_tokens, max_model_len - r.num_tokens) - 1
        if left < k_max:
            k_max = left
    if k_max < 1:
        return None

    r0 = 0
    for r in running:
        r0 += r.num_computed_tokens + 1
    ends: list[float] = []
    t = start
    while len(ends) < k_max:
        if t >= lease_expiry:
            break
        j = len(ends)
        ctx = r0 + j * s
        d = step_time(s, s, float(ctx), ctx, num_new_seqs=0)  # a pure-decode stretch admits none
        if t + d > until:
            break
        t += d
        ends.append(t)
    k = len(ends)
    if k == 0:
        return None

    bs = block_size
    ops: list[BlockOp] = []
    for i, r in enumerate(running):
        c0 = r.num_computed_tokens
        j = len(r.blocks) * bs - c0  # first step whose token needs a new block
        while j < k:
            ops.append((j, i, 0))
            j += bs
        if caching:
            n_hashes = len(r.block_hashes)
            if not r.token_free:
                n_hashes = max(n_hashes, (r.num_tokens + k - 1) // bs)
            last = min((c0 + k) // bs, n_hashes)
            m = r.num_cached_blocks + 1
            prev = -1
            while m <= last:
                j = max(0, m * bs - c0 - 1)
                if j != prev:
                    ops.append((j, i, 1))
                    prev = j
                m += 1
    ops.sort()
    allocs = 0
    for j, _, kind in ops:
        if kind == 0:
            allocs += 1
            if allocs > num_free_blocks:
                k = j  # step j would preempt: stop before it
                break
    if k == 0:
        return None
    del ends[k:]
    return ends, [op for op in ops if op[0] < k]
