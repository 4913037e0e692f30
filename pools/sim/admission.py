"""Admission of waiting requests into a step: vLLM v1's waiting-queue pass, FCFS.

Runs only in a step that preempted nothing (the scheduler's step 2). While the token budget
lasts and fewer than `max_num_seqs` run, the head of `waiting` is looked at:

- a request still loading remote KV (`WAITING_FOR_REMOTE_KVS`) is skipped (put back in order);
- on its first admission the prefix cache is looked up (longest chain of cached full blocks,
  at most `num_tokens - 1` tokens) and the connector asked how many more tokens come from a
  remote prefill (`do_remote_prefill`); prefix-cache stats are recorded once per admission;
- it is admitted only if blocks for its *whole* sequence are free after the hit
  (`scheduler_reserve_full_isl`, vLLM 0.32's default) and its next chunk's blocks fit; one that
  does not fit stops admission (head-of-line, as vLLM);
- with remote tokens it does not run yet: its blocks are allocated, a `RemoteLoad` is handed to
  the caller and it waits for `finish_remote_load`; else it joins `running` with its chunk
  (`min(num_tokens - num_computed, budget, max_model_len - 1 - num_computed)` tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pools.sim.block_pool import KVCacheBlock
from pools.sim.outputs import RemoteLoad
from pools.sim.request import Request, RequestStatus

if TYPE_CHECKING:
    from pools.sim.scheduler import Scheduler


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def admit_waiting(
    sched: Scheduler,
    budget: int,
    scheduled: list[tuple[Request, int]],
    sched_index: dict[str, int],
    new_loads: list[RemoteLoad],
) -> int:
    """Admit waiting requests into the step being built (module docstring); appends to
    `scheduled` / `sched_index` / `new_loads` and returns the token budget left."""
    kv = sched.kv_cache_manager
    connector = sched.connector
    config = sched.config
    bs = sched.block_size
    caching = config.enable_prefix_caching
    max_seqs = config.max_num_seqs
    max_len_m1 = config.max_model_len - 1
    reserve_full = config.scheduler_reserve_full_isl
    waiting = sched.waiting
    running = sched.running
    skipped: list[Request] = []
    while waiting and budget > 0 and len(running) < max_seqs:
        r = waiting[0]
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            skipped.append(waiting.popleft())
            continue
        hit_blocks: list[KVCacheBlock] = []
        num_local = 0
        num_ext = 0
        did_lookup = False
        if r.num_computed_tokens == 0:
            did_lookup = caching and not r.skip_stats
            hit_blocks = kv.get_computed_blocks(r)
            num_local = len(hit_blocks) * bs
            num_ext = connector.get_num_new_matched_tokens(r, num_local)
            num_computed = num_local + num_ext
        else:
            num_computed = r.num_computed_tokens
        load_async = num_ext > 0
        if load_async:
            n = 0
        else:
            n = r.num_tokens - num_computed
            if n > budget:
                n = budget
            if n > max_len_m1 - num_computed:
                n = max_len_m1 - num_computed
            if n <= 0:
                break
        have = len(hit_blocks) + len(r.blocks)
        need = _cdiv(num_computed + n, bs) - have
        free = kv.free_blocks_after_hit(hit_blocks)
        if reserve_full and _cdiv(min(r.num_tokens, max_len_m1 + 1), bs) - have > free:
            break  # the whole sequence must fit before admission (vLLM 0.32 default)
        if need > free:
            break
        waiting.popleft()
        kv.allocate_slots(r, hit_blocks, need)
        if did_lookup:
            kv.record_prefix_stats(r, num_local, num_ext)
        if r.num_preemptions == 0 and not r.sources_set:
            r.sources_set = True
            r.num_local_cached_tokens = num_local
            r.num_external_tokens = num_ext
        if load_async:
            r.status = RequestStatus.WAITING_FOR_REMOTE_KVS
            r.num_computed_tokens = num_computed
            new_loads.append(connector.start_load(r, len(hit_blocks), num_ext))
            skipped.append(r)
            continue
        r.num_computed_tokens = num_computed
        kv.cache_blocks(r, num_computed + n)
        r.status = RequestStatus.RUNNING
        running.append(r)
        sched_index[r.request_id] = len(scheduled)
        scheduled.append((r, n))
        budget -= n
    if skipped:
        waiting.extendleft(reversed(skipped))
    return budget
