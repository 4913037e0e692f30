"""The scheduler: vLLM v1's `Scheduler` (`vllm/v1/core/sched/scheduler.py`, read not copied).

`schedule(now)` decides one step; the engine core times it (`TimingModel`, the stand-in for the
model executor); `update_from_output(so, duration)` samples, checks stops and retires finished
requests. Blocks go through the `KVCacheManager`, P/D loads and held blocks through the
`ConnectorState`, counters into the one `EngineCounters`.

Scheduling (one step):

1. Running requests first, in order. Each gets `min(num_tokens - num_computed, budget,
   max_model_len - 1 - num_computed)` tokens: a decode gets 1, a prefill gets its next chunk
   (chunked prefill). If its new blocks do not fit, the *last* running request is preempted
   (blocks freed, progress dropped: recompute) until they fit or the request itself was the one
   preempted.
2. Then, only if nothing was preempted this step, waiting requests in FCFS order while the budget
   lasts and fewer than `max_num_seqs` run. A request's first admission looks up the prefix
   cache (longest chain of cached full blocks, at most `num_tokens - 1` tokens so the last token
   is always computed) and records prefix-cache stats. A request is admitted only if blocks for
   its *whole* sequence are free (`scheduler_reserve_full_isl`, vLLM 0.32's default), and one
   that does not fit stops admission (head-of-line, as vLLM).
3. Blocks are cached (hash -> block, `BlockStored`) when allocated for tokens being computed,
   full blocks only; output tokens fill and cache blocks too.

P/D (vLLM NixlConnector semantics): a prefill leg (`do_remote_decode`) that finishes by stop or
length has its blocks held (`ConnectorState.hold`) and its final output carries the decode leg's
`kv_transfer_params`; a decode leg (`do_remote_prefill`) reuses its local prefix hit, allocates
the rest and waits for the caller's `RemoteLoad`; when the load succeeds only the last prompt
token is recomputed (vLLM does the same to get logits) and the prompt counts as
`external_kv_transfer`.

Decode fast-forward (`fast_forward_decode`) is a mode of this scheduler: many pure-decode steps
in one call, planned by `pools/sim/decode_stretch.py` and applied here in scheduler order.

Costs per step are O(scheduled requests); a block is hashed once, when it becomes full.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable

from pools.sim.block_pool import KVCacheBlock
from pools.sim.config import EngineConfig
from pools.sim.decode_stretch import plan_decode_stretch
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
from pools.sim.request import Request, RequestStatus, SimRequest, check_stop
from pools.sim.stats import EngineCounters
from pools.sim.token_gen import TokenGenerator
from pools.sim.words import WordGenerator
from transfer.params import KvTransferParams

StepTime = Callable[..., float]
"""`TimingModel.step_time(num_tokens, num_seqs, attn_ctx_tokens, kv_read_tokens, *,
num_new_seqs)`: the cost of one step (the model executor's stand-in)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
        max_len_m1 = self.config.max_model_len - 1
        scheduled: list[tuple[Request, int]] = []
        sched_index: dict[str, int] = {}
        num_preempted = 0
        bs = self.block_size
        kv = self.kv_cache_manager
        free_q = kv.block_pool.free_block_queue
        caching = self.config.enable_prefix_caching

        # 1. running requests
        running = self.running
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
            need = -(-(c + n) // bs) - len(r.blocks)  # _cdiv inlined: once per running request
            self_preempted = False
            while need > free_q.num_free_blocks:
                victim = running.pop()
                num_preempted += 1
                if victim.request_id in sched_index:
                    budget += self._unschedule(victim, scheduled, sched_index)
                self._preempt(victim)
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

        # 2. waiting requests (not when this step preempted)
        num_new = 0
        if num_preempted == 0:
            first_admitted = len(scheduled)
            budget = self._schedule_waiting(budget, scheduled, sched_index, new_loads)
            # A request leaves `waiting` for `running` once unless preempted: admitted with no
            # preemption behind it = scheduled for the first time (the per-request cost).
            for r, _ in scheduled[first_admitted:]:
                if r.num_preemptions == 0:
                    num_new += 1

        # 3. the step's cost arguments; computed tokens advance
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
            num_new_seqs=num_new,
            num_scheduled_tokens=num_tokens,
            num_prefill_tokens=n_prefill,
            num_decode_tokens=n_decode,
            attn_ctx_tokens=attn,
            kv_read_tokens=kv_read,
        )

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
        """Run many pure-decode steps in one call; None when the mode does not apply.

        Applies when every running request decodes (first token out, one token left to
        compute, no `stop_token_ids`), the batch fits the token budget and nothing else can be
        scheduled (no waiting request but those loading remote KV, no finished load). Stops
        before a finish, a preemption, a lease expiry, `until` (every step ends by it) and
        `max_steps` (`pools/sim/decode_stretch.py`). State, KV events and timings equal
        calling `schedule` / `update_from_output` once per step.
        """
        running = self.running
        if not running or self.connector.finished_loads:
            return None
        if len(self.waiting) != self.connector.num_loading:
            return None
        if len(running) > self.config.max_num_batched_tokens:
            return None
        start = now if now > self.busy_until else self.busy_until
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
        expiry = self.connector.next_expiry()
        kv = self.kv_cache_manager
        plan = plan_decode_stretch(
            running,
            start=start,
            until=until,
            lease_expiry=float("inf") if expiry is None else expiry,
            max_steps=max_steps,
            max_model_len=self.config.max_model_len,
            block_size=self.block_size,
            caching=self.config.enable_prefix_caching,
            num_free_blocks=kv.num_free_blocks(),
            step_time=step_time,
        )
        if plan is None:
            return None
        ends, ops = plan
        k = len(ends)
        # Tokens (and, with token ids, the hashes of blocks they fill) first: caching reads them.
        tg = self.token_gen
        caching = self.config.enable_prefix_caching
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
        self.busy_until = ends[-1]
        self.counters.num_steps += k
        self.counters.generation_tokens += k * len(running)
        return DecodeFastForward(
            start=start,
            end=ends[-1],
            step_ends=ends,
            request_ids=[r.request_id for r in running],
            new_token_ids=new_tokens,
            num_output_tokens=[r.num_output_tokens for r in running],
        )

    # ------------------------------------------------------------------ scheduling parts
    def _schedule_waiting(
        self,
        budget: int,
        scheduled: list[tuple[Request, int]],
        sched_index: dict[str, int],
        new_loads: list[RemoteLoad],
    ) -> int:
        kv = self.kv_cache_manager
        connector = self.connector
        bs = self.block_size
        caching = self.config.enable_prefix_caching
        max_seqs = self.config.max_num_seqs
        max_len_m1 = self.config.max_model_len - 1
        reserve_full = self.config.scheduler_reserve_full_isl
        waiting = self.waiting
        skipped: list[Request] = []
        while waiting and budget > 0 and len(self.running) < max_seqs:
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
            self.running.append(r)
            sched_index[r.request_id] = len(scheduled)
            scheduled.append((r, n))
            budget -= n
        if skipped:
            waiting.extendleft(reversed(skipped))
        return budget

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

    def _unschedule(
        self, r: Request, scheduled: list[tuple[Request, int]], sched_index: dict[str, int]
    ) -> int:
        idx = sched_index.pop(r.request_id)
        n = scheduled[idx][1]
        del scheduled[idx]
        for j in range(idx, len(scheduled)):
            sched_index[scheduled[j][0].request_id] = j
        return n

    def _preempt(self, r: Request) -> None:
        self.kv_cache_manager.free(r)
        r.num_computed_tokens = 0
        r.status = RequestStatus.PREEMPTED
        r.num_preemptions += 1
        self.counters.num_preemptions += 1
        self.waiting.appendleft(r)

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
