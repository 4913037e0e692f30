"""One step's batch as the timing model costs it (the scheduler's step 3).

After the running pass (`preemption.py`) and admission (`admission.py`) chose `scheduled`
(request, tokens) pairs, this advances every request's computed tokens and sums the step's
cost arguments for `TimingModel.step_time`:

    num_scheduled_tokens = sum n
    attn_ctx_tokens      = sum n * (c + (n + 1) / 2)     (attention: each new token reads the
                                                          context before it, c = computed before)
    kv_read_tokens       = sum (c + n)                   (decode: KV bytes read per step)

split into prefill tokens (`c < num_prompt_tokens`) and decode tokens. A request whose computed
tokens reach `num_tokens` is sampled this step; a partial prefill chunk samples nothing.
"""

from __future__ import annotations

from pools.sim.outputs import RemoteLoad, RequestOutput, SchedulerOutput
from pools.sim.request import Request


def compose_step(
    start: float,
    scheduled: list[tuple[Request, int]],
    outputs: list[RequestOutput],
    new_loads: list[RemoteLoad],
    num_preempted: int,
    num_new_seqs: int,
) -> SchedulerOutput:
    """Advance the scheduled requests' computed tokens; the step's `SchedulerOutput`."""
    num_tokens = 0
    attn = 0.0
    kv_read = 0
    n_prefill = 0
    n_decode = 0
    sampled: list[Request] = []
    for r, n in scheduled:
        c = r.num_computed_tokens
        num_tokens += n
        attn += n * (c + (n + 1) * 0.5)
        kv_read += c + n
        if c >= r.num_prompt_tokens:
            n_decode += n
        else:
            n_prefill += n
        c += n
        r.num_computed_tokens = c
        if c >= r.num_tokens:  # else a partial prefill chunk: nothing sampled
            sampled.append(r)
    return SchedulerOutput(
        start=start,
        scheduled=scheduled,
        sampled=sampled,
        outputs=outputs,
        new_remote_loads=new_loads,
        num_preempted=num_preempted,
        num_new_seqs=num_new_seqs,
        num_scheduled_tokens=num_tokens,
        num_prefill_tokens=n_prefill,
        num_decode_tokens=n_decode,
        attn_ctx_tokens=attn,
        kv_read_tokens=kv_read,
    )
