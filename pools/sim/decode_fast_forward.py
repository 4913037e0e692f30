"""The scheduler's decode fast-forward mode: many pure-decode steps in one call.

`Scheduler.fast_forward_decode` delegates here. This module checks that the mode applies and
applies the plan `decode_stretch.plan_decode_stretch` makes (tokens, block operations, computed
tokens, counters) in the order the one-step cycle would, so state, KV events and timings equal
calling `schedule` / `update_from_output` once per step (`tests/pools/sim/test_fast_forward.py`,
`tests/pools/sim/test_scheduler.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pools.sim.decode_stretch import plan_decode_stretch
from pools.sim.outputs import DecodeFastForward
from pools.sim.request import RequestStatus

if TYPE_CHECKING:
    from pools.sim.scheduler import Scheduler

StepTime = Callable[..., float]
"""`TimingModel.step_time(num_tokens, num_seqs, attn_ctx_tokens, kv_read_tokens, *,
num_new_seqs)`: the cost of one step (the model executor's stand-in)."""


def fast_forward_decode(
    sched: Scheduler,
    now: float,
    until: float,
    step_time: StepTime,
    max_steps: int | None = None,
) -> DecodeFastForward | None:
    """Run many pure-decode steps in one call; None when the mode does not apply.

    Applies when every running request decodes (first token out, one token left to
    compute, no `stop_token_ids`), the batch fits the token budget and nothing else can be
    scheduled (no waiting request but those loading remote KV, no finished load). Stops
    before a finish, a preemption, a lease expiry, `until` (every step ends by it) and
    `max_steps` (`pools/sim/decode_stretch.py`). State, KV events and timings equal
    calling `schedule` / `update_from_output` once per step.
    """
    running = sched.running
    if not running or sched.connector.finished_loads:
        return None
    if len(sched.waiting) != sched.connector.num_loading:
        return None
    if len(running) > sched.config.max_num_batched_tokens:
        return None
    start = now if now > sched.busy_until else sched.busy_until
    s = len(running)
    # The cheapest step this batch could take (every context at its floor, one token per
    # sequence; `step_time` grows with context): if even it ends after `until`, no stretch
    # fits, so skip the O(batch) checks below. Most attempts end here when arrivals come
    # faster than decode steps (the fleet simulator's horizon is the next arrival).
    if start + step_time(s, s, float(s), s, num_new_seqs=0) > until:
        return None
    for r in running:
        if (
            not r.first_token_done
            or r.num_computed_tokens != r.num_tokens - 1
            or r.stop_ids
            or r.status != RequestStatus.RUNNING
        ):
            return None
    expiry = sched.connector.next_expiry()
    kv = sched.kv_cache_manager
    plan = plan_decode_stretch(
        running,
        start=start,
        until=until,
        lease_expiry=float("inf") if expiry is None else expiry,
        max_steps=max_steps,
        max_model_len=sched.config.max_model_len,
        block_size=sched.block_size,
        caching=sched.config.enable_prefix_caching,
        num_free_blocks=kv.num_free_blocks(),
        step_time=step_time,
    )
    if plan is None:
        return None
    ends, ops = plan
    k = len(ends)
    # Tokens (and, with token ids, the hashes of blocks they fill) first: caching reads them.
    tg = sched.token_gen
    caching = sched.config.enable_prefix_caching
    new_tokens: list[list[int]] = []
    for r in running:
        if r.token_free:
            new_tokens.append([])  # nobody reads token ids in token-free mode
            continue
        toks = [tg.next(r.gen_state) for _ in range(k)]
        new_tokens.append(toks)
        r.all_token_ids.extend(toks)
        if caching:
            r.hasher.extend(r.all_token_ids, r.block_hashes)
    kv.apply_block_ops(running, ops)
    for r in running:
        r.num_computed_tokens += k
        r.num_tokens += k
        r.num_output_tokens += k
    sched.busy_until = ends[-1]
    sched.counters.num_steps += k
    sched.counters.generation_tokens += k * len(running)
    return DecodeFastForward(
        start=start,
        end=ends[-1],
        step_ends=ends,
        request_ids=[r.request_id for r in running],
        new_token_ids=new_tokens,
        num_output_tokens=[r.num_output_tokens for r in running],
    )
