"""The scheduler: vLLM v1's `Scheduler` (`vllm/v1/core/sched/scheduler.py`, read not copied).

`schedule(now)` decides one step; the engine core times it (`TimingModel`, the stand-in for the
model executor); `update_from_output(so, duration)` samples, checks stops and retires finished
requests. Blocks go through the `KVCacheManager`, P/D loads and held blocks through the
`ConnectorState`, counters into the one `EngineCounters`.

Scheduling (one step; `schedule` composes the three parts, each in its own module):

1. Running requests first, in order (`preemption.py`). Each gets `min(num_tokens -
   num_computed, budget, max_model_len - 1 - num_computed)` tokens: a decode gets 1, a prefill
   gets its next chunk (chunked prefill). If its new blocks do not fit, the *last* running
   request is preempted (blocks freed, progress dropped: recompute) until they fit or the
   request itself was the one preempted.
2. Then, only if nothing was preempted this step, waiting requests in FCFS order while the
   budget lasts and fewer than `max_num_seqs` run (`admission.py`). A request's first admission
   looks up the prefix cache (longest chain of cached full blocks, at most `num_tokens - 1`
   tokens so the last token is always computed) and records prefix-cache stats. A request is
   admitted only if blocks for its *whole* sequence are free (`scheduler_reserve_full_isl`,
   vLLM 0.32's default), and one that does not fit stops admission (head-of-line, as vLLM).
3. The batch's computed tokens advance and its cost arguments are summed (`step_batch.py`).
   Blocks are cached (hash -> block, `BlockStored`) when allocated for tokens being computed,
   full blocks only; output tokens fill and cache blocks too.

P/D (vLLM NixlConnector semantics): a prefill leg (`do_remote_decode`) that finishes by stop or
length has its blocks held (`ConnectorState.hold`) and its final output carries the decode leg's
`kv_transfer_params`; a decode leg (`do_remote_prefill`) reuses its local prefix hit, allocates
the rest and waits for the caller's `RemoteLoad`; when the load succeeds only the last prompt
token is recomputed (vLLM does the same to get logits) and the prompt counts as
`external_kv_transfer`.

Decode fast-forward (`fast_forward_decode`) is a mode of this scheduler: many pure-decode steps
in one call, planned by `pools/sim/decode_stretch.py` and applied in scheduler order by
`pools/sim/decode_fast_forward.py`.

Costs per step are O(scheduled requests); a block is hashed once, when it becomes full.
"""

from __future__ import annotations

import contextlib
from collections import deque

from pools.sim.admission import admit_waiting
from pools.sim.config import EngineConfig
from pools.sim.decode_fast_forward import StepTime, fast_forward_decode
from pools.sim.kv_cache_manager import KVCacheManager
from pools.sim.kv_connector import ConnectorState
from pools.sim.outputs import (
    DecodeFastForward,
    RemoteLoad,
    RequestOutput,
    SchedulerOutput,
    StepResult,
    make_output,
)
from pools.sim.preemption import schedule_running
from pools.sim.request import Request, RequestStatus, SimRequest, check_stop
from pools.sim.stats import EngineCounters
from pools.sim.step_batch import compose_step
from pools.sim.token_gen import TokenGenerator
from pools.sim.words import WordGenerator
from transfer.params import KvTransferParams

__all__ = ["Scheduler", "StepTime"]


class Scheduler:
    """Request queues and one step's decisions; see the module docstring."""

    def __init__(self, config: EngineConfig, num_gpu_blocks: int, vocab_size: int) -> None:
        self.config = config
        self.block_size = config.block_size
        self.counters = EngineCounters()
        self.kv_cache_manager = KVCacheManager(config, num_gpu_blocks, self.counters)
        self.connector = ConnectorState(config, self.kv_cache_manager)
        exclude = [config.eos_token_id] if config.eos_token_id is not None else []
        self.token_gen: TokenGenerator | WordGenerator = (
            WordGenerator()
            if config.text == "words"
            else TokenGenerator(vocab_size, exclude=exclude)
        )
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # False once a step found nothing to do; any change that may make work sets it again
        self.dirty = True
        self.busy_until = float("-inf")

    # ------------------------------------------------------------------ requests in/out
    def add_request(self, req: SimRequest) -> None:
        """Queue a request (FCFS). Raises ValueError naming the bad field."""
        if req.request_id in self.requests:
            raise ValueError(f"request_id: {req.request_id!r} is already in the engine")
        req.validate(self.config.max_model_len)
        r = Request(req, self.block_size, self.token_gen.start(req.prompt_token_ids, req.seed))
        if self.config.enable_prefix_caching and not r.token_free:
            r.hasher.extend(r.all_token_ids, r.block_hashes)
        self.requests[req.request_id] = r
        self.waiting.append(r)
        self.dirty = True

    def abort_request(self, request_id: str, now: float) -> RequestOutput | None:
        """Finish a request with `"abort"` and free its blocks; None if not in the engine."""
        r = self.requests.get(request_id)
        if r is None:
            return None
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            self.connector.forget(r)
        if r in self.running:
            self.running.remove(r)
        else:
            with contextlib.suppress(ValueError):
                self.waiting.remove(r)
        r.status = RequestStatus.FINISHED_ABORTED
        self._finish(r, now, hold=False)
        self.dirty = True
        return make_output(r, [], finished=True)

    def finish_remote_load(self, request_id: str, ok: bool) -> None:
        """The caller's transfer for `request_id` ended; applied at the next step."""
        r = self.requests.get(request_id)
        if r is None or r.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
            return
        if self.connector.finish_load(r, ok):
            self.dirty = True

    def release_held(self, request_id: str) -> bool:
        if not self.connector.release(request_id):
            return False
        self.dirty = True
        return True

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache(list(self.requests.values()))

    # ------------------------------------------------------------------ clock helpers
    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting)

    def next_step_time(self, now: float) -> float | None:
        """When to step next (None: nothing to do until a new call into the core)."""
        start = max(now, self.busy_until)
        if self.running or self.connector.finished_loads:
            return start
        if len(self.waiting) > self.connector.num_loading and self.dirty:
            return start
        expiry = self.connector.next_expiry()
        if expiry is not None:
            return max(start, expiry)
        return None

    # ------------------------------------------------------------------ one step
    def schedule(self, now: float) -> SchedulerOutput:
        """Decide the step starting at `max(now, busy_until)` and advance computed tokens."""
        start = now if now > self.busy_until else self.busy_until
        self.counters.num_steps += 1
        if self.connector.expire(start):
            self.dirty = True
        outputs: list[RequestOutput] = []
        if self.connector.finished_loads:
            self._apply_finished_loads(start, outputs)
        new_loads: list[RemoteLoad] = []

        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        sched_index: dict[str, int] = {}
        # 1. running requests, preempting the last ones when blocks run out
        budget, num_preempted = schedule_running(self, budget, scheduled, sched_index)

        # 2. waiting requests (not when this step preempted)
        num_new = 0
        if num_preempted == 0:
            first_admitted = len(scheduled)
            budget = admit_waiting(self, budget, scheduled, sched_index, new_loads)
            # A request leaves `waiting` for `running` once unless preempted: admitted with no
            # preemption behind it = scheduled for the first time (the per-request cost).
            for r, _ in scheduled[first_admitted:]:
                if r.num_preemptions == 0:
                    num_new += 1

        # 3. the step's cost arguments; computed tokens advance
        return compose_step(start, scheduled, outputs, new_loads, num_preempted, num_new)

    def update_from_output(self, so: SchedulerOutput, duration_s: float) -> StepResult:
        """Sample one token per `so.sampled` request, check stops, retire finished requests;
        the step ends at `so.start + duration_s`."""
        end = so.start + duration_s
        self.busy_until = end
        outputs = so.outputs
        finished: list[Request] = []
        tg = self.token_gen
        eos = self.config.eos_token_id
        max_len = self.config.max_model_len
        bs = self.block_size
        caching = self.config.enable_prefix_caching
        output = make_output
        for r in so.sampled:
            tok = (
                tg.positional(r.sim.seed, r.num_output_tokens)
                if r.token_free
                else tg.next(r.gen_state)
            )
            r.num_tokens += 1
            r.num_output_tokens += 1
            if not r.token_free:
                r.all_token_ids.append(tok)
                if caching and r.num_tokens % bs == 0:
                    r.hasher.extend(r.all_token_ids, r.block_hashes)
            first = not r.first_token_done
            if first:
                r.first_token_done = True
                self.counters.count_prompt(
                    r.num_prompt_tokens, r.num_local_cached_tokens, r.num_external_tokens
                )
            if (
                r.num_output_tokens < r.max_tokens
                and r.num_tokens < max_len
                and (r.num_output_tokens < r.min_tokens or (tok not in r.stop_ids and tok != eos))
            ):
                outputs.append(output(r, [tok], False, first))
                continue
            status = check_stop(r, tok, max_len, eos)
            if status is None:  # eos with ignore_eos
                outputs.append(output(r, [tok], False, first))
                continue
            r.status = status
            finished.append(r)
            params = self._finish(r, end, hold=r.do_remote_decode)
            out = output(r, [tok], True, first)
            out.kv_transfer_params = params
            outputs.append(out)
        self.counters.generation_tokens += len(so.sampled)
        if finished:
            done = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in done]
        elif not so.scheduled and not so.new_remote_loads:
            self.dirty = False
        return StepResult(
            start=so.start,
            duration_s=duration_s,
            end=end,
            num_scheduled_tokens=so.num_scheduled_tokens,
            num_prefill_tokens=so.num_prefill_tokens,
            num_decode_tokens=so.num_decode_tokens,
            outputs=outputs,
            new_remote_loads=so.new_remote_loads,
            num_preempted=so.num_preempted,
            num_scheduled_by_request={r.request_id: n for r, n in so.scheduled},
        )

    # ------------------------------------------------------------------ fast-forward mode
    def fast_forward_decode(
        self, now: float, until: float, step_time: StepTime, max_steps: int | None = None
    ) -> DecodeFastForward | None:
        """Many pure-decode steps in one call, or None (`decode_fast_forward.py`)."""
        return fast_forward_decode(self, now, until, step_time, max_steps)

    # ------------------------------------------------------------------ scheduling parts
    def _apply_finished_loads(self, now: float, outputs: list[RequestOutput]) -> None:
        """Finished loads: cache what arrived (only the last prompt token is then recomputed,
        as vLLM does to get logits), or apply `kv_load_failure_policy`."""
        kv = self.kv_cache_manager
        for r in self.connector.take_finished_loads():
            if self.requests.get(r.request_id) is not r:
                continue  # aborted meanwhile
            ok = r.load_result
            r.load_result = None
            if ok:
                kv.cache_blocks(r, r.num_computed_tokens)
                if r.num_computed_tokens >= r.num_tokens:
                    r.num_computed_tokens = r.num_tokens - 1
                r.status = RequestStatus.PREEMPTED if r.num_preemptions else RequestStatus.WAITING
            elif self.config.kv_load_failure_policy == "recompute":
                kv.free(r)
                r.num_computed_tokens = 0
                r.num_external_tokens = 0
                r.sources_set = False
                r.skip_stats = True
                r.status = RequestStatus.WAITING
            else:
                self.waiting.remove(r)
                r.status = RequestStatus.FINISHED_ERROR
                self._finish(r, now, hold=False)
                outputs.append(make_output(r, [], finished=True))

    def _finish(self, r: Request, now: float, hold: bool) -> KvTransferParams | None:
        """Retire a finished request: hold its blocks (prefill leg) or free them."""
        del self.requests[r.request_id]
        reason = r.status.finish_reason
        success = self.counters.request_success
        if reason is not None:
            success[reason] = success.get(reason, 0) + 1
        if (
            hold
            and r.blocks
            and r.status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)
        ):
            params = self.connector.hold(r, now)
            r.blocks = []
            return params
        if r.blocks:
            self.kv_cache_manager.free(r)
        return None
