"""Decode fast-forward: many identical pure-decode engine steps in one call.

Why: a fleet simulator replaying an hour of traffic on 16 replicas runs millions of decode
steps (~20 ms each); at ~30 us of Python per `EngineCore.step` that alone takes minutes. Between
two events that can change a replica's batch (an arrival, a finish, a KV transfer, a lease
expiry), its decode steps differ only in how long each takes (every sequence's context grows by
one token per step), so they can be advanced in one call.

Applies when (else `None`, and the caller uses `step`):

- every running request is decoding (its first token was produced, exactly one token left to
  compute) and has no `stop_token_ids` (the generator never draws eos, so it ends by length
  only), and the batch fits the token budget;
- nothing else can be scheduled: no waiting request except those waiting for remote KV, no
  finished remote load to apply.

It stops before: the step that would finish a request (`max_tokens`, `max_model_len`; that step
runs through `step` with its full outputs), the first block allocation that would not fit
(`step` preempts there), a step that would start at or after a lease expiry, a step that would
end after `until`, and `max_steps`.

Equivalence: block allocations (with their evictions) and block caching run in exactly the
order the per-step scheduler runs them (step by step, running order, allocate before cache), step
durations come from the same `TimingModel.step_time` with the same arguments, and counters
advance by the same amounts; so the core's state, KV events and timings equal those of stepping
one by one (`tests/pools/sim/test_fast_forward.py`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pools.sim.request import RequestStatus

if TYPE_CHECKING:
    from pools.sim.engine_core import EngineCore


@dataclass(slots=True)
class DecodeFastForward:
    """What `num_steps` pure-decode steps produced: every running request got one token per step.

    `step_ends[j]` is when step j's outputs are valid; `request_ids` in running order;
    `new_token_ids[i]` the tokens request i generated (one per step; empty for token-free
    requests, whose token ids nobody reads); `num_output_tokens[i]` its total after the last
    step.
    """

    start: float
    end: float
    step_ends: list[float]
    request_ids: list[str]
    new_token_ids: list[list[int]]
    num_output_tokens: list[int]

    @property
    def num_steps(self) -> int:
        return len(self.step_ends)


def _earliest_lease(core: EngineCore) -> float:
    heap = core._lease_heap
    while heap:
        expiry, rid = heap[0]
        entry = core.held.get(rid)
        if entry is not None and entry[1] == expiry:
            return expiry
        heapq.heappop(heap)  # released early: stale (as next_step_time drops it)
    return float("inf")


def fast_forward_decode(
    core: EngineCore, now: float, until: float, max_steps: int | None = None
) -> DecodeFastForward | None:
    """See the module docstring."""
    running = core.running
    if not running or core._finished_loads:
        return None
    if len(core.waiting) != core._num_loading:
        return None
    cfg = core.config
    s = len(running)
    if s > cfg.max_num_batched_tokens:
        return None
    max_len = cfg.max_model_len
    k_max = max_steps if max_steps is not None else 1 << 62
    for r in running:
        if (
            not r.first_token_done
            or r.num_computed_tokens != r.num_tokens - 1
            or r.stop_ids
            or r.status != RequestStatus.RUNNING
        ):
            return None
        # The step producing output max_tokens (or reaching max_model_len) finishes r.
        left = min(r.max_tokens - r.num_output_tokens, max_len - r.num_tokens) - 1
        if left < k_max:
            k_max = left
    if k_max < 1:
        return None

    start = now if now > core.busy_until else core.busy_until
    lease = _earliest_lease(core)
    timing = core.timing
    step_time = timing.step_time
    r0 = 0
    for r in running:
        r0 += r.num_computed_tokens + 1
    ends: list[float] = []
    t = start
    while len(ends) < k_max:
        if t >= lease:
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

    # Block operations in scheduler order: (step, running index, 0 = allocate / 1 = cache).
    bs = core.block_size
    caching = cfg.enable_prefix_caching
    ops: list[tuple[int, int, int]] = []
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
    free = core.block_pool.free_block_queue.num_free_blocks
    allocs = 0
    for j, _, kind in ops:
        if kind == 0:
            allocs += 1
            if allocs > free:
                k = j  # step j would preempt: stop before it
                break
    if k == 0:
        return None
    del ends[k:]

    # Tokens (and, with token ids, the hashes of blocks they fill) first: caching reads them.
    tg = core.token_gen
    new_tokens: list[list[int]] = []
    for r in running:
        if r.token_free:
            new_tokens.append([])  # nobody reads token ids in token-free mode
            continue
        base = r.gen_base
        n0 = r.num_output_tokens
        toks = [tg.token(base, n0 + j) for j in range(k)]
        new_tokens.append(toks)
        r.all_token_ids.extend(toks)
        if caching:
            r.hasher.extend(r.all_token_ids, r.block_hashes)
    pool = core.block_pool
    c0s = [r.num_computed_tokens for r in running]
    for j, i, kind in ops:
        if j >= k:
            break
        r = running[i]
        if kind == 0:
            r.blocks.extend(pool.get_new_blocks(1))
        else:
            core._cache_blocks(r, c0s[i] + j + 1)
    for r in running:
        r.num_computed_tokens += k
        r.num_tokens += k
        r.num_output_tokens += k
    core.busy_until = ends[-1]
    core._num_steps += k
    core._generation_tokens += k * s
    return DecodeFastForward(
        start=start,
        end=ends[-1],
        step_ends=ends,
        request_ids=[r.request_id for r in running],
        new_token_ids=new_tokens,
        num_output_tokens=[r.num_output_tokens for r in running],
    )
