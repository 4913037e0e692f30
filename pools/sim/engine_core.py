"""The simulated engine core: vLLM v1's scheduler + KV cache manager, clock-injected.

Pure: no sleeps, no sockets, no global clock. Every time-dependent call takes `now` (seconds).
`step(now)` runs one engine step and returns how long it took (from the `TimingModel`) and what
it produced; the caller (real-time server or virtual-time fleet simulator) advances its clock.

Scheduling (vLLM v1, `vllm/v1/core/sched/scheduler.py`, read not copied):

1. Running requests first, in order. Each gets `min(num_tokens - num_computed, budget,
   max_model_len - 1 - num_computed)` tokens: a decode gets 1, a prefill gets its next chunk
   (chunked prefill). If its new blocks do not fit, the *last* running request is preempted
   (blocks freed, progress dropped: recompute) until they fit or the request itself was the one
   preempted.
2. Then, only if nothing was preempted this step, waiting requests in FCFS order while the budget
   lasts and fewer than `max_num_seqs` run. A request's first admission looks up the prefix
   cache (longest chain of cached full blocks, at most `num_tokens - 1` tokens so the last token
   is always computed) and records prefix-cache stats: queries += num_tokens, hits += hit tokens
   (new requests; preempted ones count apart), as vLLM's `vllm:prefix_cache_*_total`. A request
   is admitted only if blocks for its *whole* sequence are free (`scheduler_reserve_full_isl`,
   vLLM 0.32's default), and one that does not fit stops admission (head-of-line, as vLLM).
3. Blocks are cached (hash → block, `BlockStored`) when allocated for tokens being computed,
   full blocks only; output tokens fill and cache blocks too.

P/D (vLLM NixlConnector semantics):

- prefill leg (`kv_transfer_params.do_remote_decode`): runs normally; when it finishes (stop or
  length) its blocks are *held* (not freed) until `release_held` or the lease
  (`kv_lease_duration_s`) expires, and its final output carries `kv_transfer_params` for the
  decode leg.
- decode leg (`kv_transfer_params.do_remote_prefill`): at admission the local prefix hit is
  reused, blocks for the rest of the prompt are allocated and the request waits
  (`WAITING_FOR_REMOTE_KVS`) while the caller moves the KV (`RemoteLoad`). On
  `finish_remote_load(ok=True)` the loaded blocks are cached and only the last prompt token is
  recomputed (vLLM does the same to get logits): the prompt counts as `external_kv_transfer`.

Costs per step are O(scheduled requests); a block is hashed once, when it becomes full.
"""

from __future__ import annotations

import contextlib
import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pools.sim.block_pool import BlockPool, KVCacheBlock
from pools.sim.config import EngineConfig
from pools.sim.hashing import BlockHasher
from pools.sim.kv_events import KVCacheEvent
from pools.sim.request import RequestStatus, SimRequest
from pools.sim.timing import TimingModel
from pools.sim.token_gen import TokenGenerator
from transfer.params import KvTransferParams

if TYPE_CHECKING:
    from pools.sim.fast_forward import DecodeFastForward

PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass(slots=True)
class RequestOutput:
    """What one request produced in one step (see README "API")."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    stop_reason: int | None
    num_prompt_tokens: int
    num_output_tokens: int
    is_first_token: bool
    num_cached_tokens: int
    num_local_cached_tokens: int
    num_external_tokens: int
    num_local_compute_tokens: int
    num_preemptions: int
    kv_transfer_params: KvTransferParams | None = None


@dataclass(slots=True)
class RemoteLoad:
    """KV the caller must move from a prefill engine into this one for a decode-leg request."""

    request_id: str
    kv_transfer_params: KvTransferParams
    remote_engine_id: str | None
    remote_host: str | None
    remote_port: int | None
    remote_request_id: str | None
    remote_block_ids: list[int]
    local_block_ids: list[int]
    num_tokens: int
    prompt_token_ids: list[int]
    first_block: int


@dataclass(slots=True)
class StepResult:
    """One engine step. Outputs are valid at `end = start + duration_s`."""

    start: float
    duration_s: float
    end: float
    num_scheduled_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    outputs: list[RequestOutput]
    new_remote_loads: list[RemoteLoad]
    num_preempted: int
    num_scheduled_by_request: dict[str, int]


@dataclass(slots=True)
class EngineStats:
    """Gauges and cumulative counters (vLLM metric names in README "API")."""

    num_running: int
    num_waiting: int
    num_waiting_for_remote_kvs: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    preempted_prefix_cache_queries: int
    preempted_prefix_cache_hits: int
    external_prefix_cache_queries: int
    external_prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens: int
    prompt_tokens_by_source: dict[str, int]
    generation_tokens: int
    request_success: dict[str, int]
    num_held_requests: int
    num_held_blocks: int
    num_gpu_blocks: int
    block_size: int
    busy_until: float
    num_steps: int = 0


class _Req:
    """Engine-internal request state (vLLM's `Request`, trimmed)."""

    __slots__ = (
        "all_token_ids",
        "block_hashes",
        "blocks",
        "do_remote_decode",
        "do_remote_prefill",
        "first_token_done",
        "gen_base",
        "hasher",
        "ignore_eos",
        "kv_params",
        "load_result",
        "max_tokens",
        "min_tokens",
        "num_cached_blocks",
        "num_computed_tokens",
        "num_external_tokens",
        "num_local_cached_tokens",
        "num_output_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "num_tokens",
        "request_id",
        "sim",
        "skip_stats",
        "sources_set",
        "status",
        "stop_ids",
        "stop_reason",
        "token_free",
    )

    def __init__(self, sim: SimRequest, block_size: int, gen_base: int) -> None:
        self.sim = sim
        self.request_id = sim.request_id
        self.all_token_ids: list[int] = list(sim.prompt_token_ids)
        # Token-free mode (SimRequest docstring): identities come as block hashes.
        self.token_free = not sim.prompt_token_ids and sim.num_prompt_tokens is not None
        self.num_prompt_tokens = (
            sim.num_prompt_tokens
            if self.token_free and sim.num_prompt_tokens is not None
            else len(sim.prompt_token_ids)
        )
        self.num_tokens = self.num_prompt_tokens  # len(all_token_ids), kept in step
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.blocks: list[KVCacheBlock] = []
        self.num_cached_blocks = 0
        self.block_hashes: list[bytes] = (
            list(sim.block_hashes) if self.token_free and sim.block_hashes else []
        )
        self.hasher = BlockHasher(
            block_size,
            lora_name=sim.lora_name,
            lora_path=sim.lora_path,
            cache_salt=sim.cache_salt,
        )
        self.gen_base = gen_base
        self.max_tokens = sim.max_tokens
        self.min_tokens = sim.min_tokens
        self.ignore_eos = sim.ignore_eos
        self.stop_ids = frozenset(sim.stop_token_ids)
        self.stop_reason: int | None = None
        self.num_preemptions = 0
        self.first_token_done = False
        self.sources_set = False
        self.num_local_cached_tokens = 0
        self.num_external_tokens = 0
        params = sim.kv_transfer_params
        self.kv_params: KvTransferParams | None = params
        self.do_remote_decode = params is not None and params.do_remote_decode
        self.do_remote_prefill = params is not None and params.do_remote_prefill
        self.load_result: bool | None = None
        self.skip_stats = False


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class EngineCore:
    """See the module docstring and pools/sim/README.md ("API")."""

    def __init__(self, config: EngineConfig, timing: TimingModel) -> None:
        self.config = config
        self.timing = timing
        self.block_size = config.block_size
        num_blocks = config.num_gpu_blocks or timing.num_gpu_blocks(config.block_size)
        self.block_pool = BlockPool(
            num_blocks,
            enable_caching=config.enable_prefix_caching,
            enable_kv_cache_events=config.enable_kv_cache_events and config.enable_prefix_caching,
        )
        vocab = config.vocab_size or timing.model.vocab_size
        exclude = [config.eos_token_id] if config.eos_token_id is not None else []
        self.token_gen = TokenGenerator(vocab, exclude=exclude)
        self.requests: dict[str, _Req] = {}
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []
        self.held: dict[str, tuple[list[KVCacheBlock], float]] = {}
        self._lease_heap: list[tuple[float, str]] = []
        self._loads: dict[str, RemoteLoad] = {}
        self._num_loading = 0  # in WAITING_FOR_REMOTE_KVS with no result yet
        self._finished_loads: list[_Req] = []
        self._held_blocks = 0
        self._dirty = True
        self.busy_until = float("-inf")
        self._events: list[KVCacheEvent] = []
        # counters
        self._prefix_queries = 0
        self._prefix_hits = 0
        self._pre_prefix_queries = 0
        self._pre_prefix_hits = 0
        self._ext_queries = 0
        self._ext_hits = 0
        self._num_preemptions = 0
        self._prompt_tokens = 0
        self._by_source = dict.fromkeys(PROMPT_SOURCES, 0)
        self._generation_tokens = 0
        self._success = dict.fromkeys(FINISH_REASONS, 0)
        self._num_steps = 0

    # ------------------------------------------------------------------ requests in/out
    def add_request(self, req: SimRequest, now: float) -> None:
        """Queue a request (FCFS). Raises ValueError naming the bad field."""
        n = len(req.prompt_token_ids)
        if n == 0 and req.num_prompt_tokens is not None:
            n = req.num_prompt_tokens  # token-free mode
        if req.request_id in self.requests:
            raise ValueError(f"request_id: {req.request_id!r} is already in the engine")
        if n == 0:
            raise ValueError("prompt_token_ids: the prompt is empty")
        if n >= self.config.max_model_len:
            raise ValueError(
                f"prompt_token_ids: prompt length {n} must be < max_model_len "
                f"{self.config.max_model_len}"
            )
        if req.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {req.max_tokens}")
        if req.min_tokens < 0:
            raise ValueError(f"min_tokens: must be >= 0, got {req.min_tokens}")
        r = _Req(req, self.block_size, TokenGenerator.base(req.prompt_token_ids, req.seed))
        if self.config.enable_prefix_caching and not r.token_free:
            r.hasher.extend(r.all_token_ids, r.block_hashes)
        self.requests[req.request_id] = r
        self.waiting.append(r)
        self._dirty = True

    def abort_request(self, request_id: str, now: float) -> RequestOutput | None:
        """Finish a request with `"abort"` and free its blocks; None if not in the engine."""
        r = self.requests.get(request_id)
        if r is None:
            return None
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            if r.load_result is None:
                self._num_loading -= 1
            elif r in self._finished_loads:
                self._finished_loads.remove(r)
        self._loads.pop(request_id, None)
        if r in self.running:
            self.running.remove(r)
        else:
            with contextlib.suppress(ValueError):
                self.waiting.remove(r)
        r.status = RequestStatus.FINISHED_ABORTED
        self._finish(r, now, hold=False)
        self._dirty = True
        return self._output(r, [], finished=True)

    def release_held(self, request_id: str, now: float) -> bool:
        """Free the blocks a finished prefill-leg request holds (its KV was pulled)."""
        entry = self.held.pop(request_id, None)
        if entry is None:
            return False
        self._held_blocks -= len(entry[0])
        self._free_blocks(entry[0])
        self._dirty = True
        return True

    def extend_lease(self, request_id: str, now: float) -> bool:
        """Push a held request's lease to `now + kv_lease_duration_s` (the decode side's
        heartbeat in vLLM's NixlConnector). False if nothing is held for it."""
        entry = self.held.get(request_id)
        if entry is None:
            return False
        expiry = now + self.config.kv_lease_duration_s
        if expiry > entry[1]:
            self.held[request_id] = (entry[0], expiry)
            heapq.heappush(self._lease_heap, (expiry, request_id))
        return True

    def pending_remote_loads(self) -> list[RemoteLoad]:
        """Remote loads admitted and not finished yet (idempotent view)."""
        return list(self._loads.values())

    def finish_remote_load(self, request_id: str, ok: bool, now: float) -> None:
        """The caller's transfer for `request_id` ended; applied at the next `step`."""
        r = self.requests.get(request_id)
        if r is None or r.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
            return
        if r.load_result is not None:
            return
        self._loads.pop(request_id, None)
        r.load_result = ok
        self._num_loading -= 1
        self._finished_loads.append(r)
        self._dirty = True

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash (AllBlocksCleared); False while blocks are in use (vLLM)."""
        ok = self.block_pool.reset_prefix_cache()
        if ok:
            for r in self.requests.values():
                r.num_cached_blocks = 0
        return ok

    def drain_events(self) -> list[KVCacheEvent]:
        """KV events since the last drain, in the order state changed."""
        return self.block_pool.take_events()

    # ------------------------------------------------------------------ clock helpers
    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting)

    def next_step_time(self, now: float) -> float | None:
        """When to call `step` next (None: nothing to do until a new call into the core)."""
        start = max(now, self.busy_until)
        if self.running or self._finished_loads:
            return start
        if len(self.waiting) > self._num_loading and self._dirty:
            return start
        heap = self._lease_heap
        while heap:
            expiry, rid = heap[0]
            entry = self.held.get(rid)
            if entry is not None and entry[1] == expiry:
                return max(start, expiry)
            heapq.heappop(heap)  # released early: drop the stale lease
        return None

    # ------------------------------------------------------------------ the step
    def step(self, now: float) -> StepResult:
        """Run one engine step starting at `max(now, busy_until)`; see the module docstring."""
        start = now if now > self.busy_until else self.busy_until
        self._num_steps += 1
        self._expire_leases(start)
        outputs: list[RequestOutput] = []
        if self._finished_loads:
            self._apply_finished_loads(start, outputs)
        new_loads: list[RemoteLoad] = []

        budget = self.config.max_num_batched_tokens
        max_len_m1 = self.config.max_model_len - 1
        scheduled: list[tuple[_Req, int]] = []
        sched_index: dict[str, int] = {}
        num_preempted = 0
        bs = self.block_size
        pool = self.block_pool
        free_q = pool.free_block_queue
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
            need = _cdiv(c + n, bs) - len(r.blocks)
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
                r.blocks.extend(pool.get_new_blocks(need))
            if caching and (c + n) // bs > r.num_cached_blocks:
                self._cache_blocks(r, c + n)
            sched_index[r.request_id] = len(scheduled)
            scheduled.append((r, n))
            budget -= n
            i += 1

        # 2. waiting requests (not when this step preempted)
        num_new = 0
        if num_preempted == 0:
            first_admitted = len(scheduled)
            budget = self._schedule_waiting(budget, scheduled, sched_index, new_loads, start)
            # A request leaves `waiting` for `running` once unless preempted: admitted with no
            # preemption behind it = scheduled for the first time (the per-request cost).
            for r, _ in scheduled[first_admitted:]:
                if r.num_preemptions == 0:
                    num_new += 1

        # 3. time the step
        num_tokens = 0
        attn = 0.0
        kv_read = 0
        n_prefill = 0
        n_decode = 0
        sampled: list[_Req] = []
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
        duration = self.timing.step_time(
            num_tokens, len(scheduled), attn, kv_read, num_new_seqs=num_new
        )
        end = start + duration
        self.busy_until = end

        # 4. sampling and stop checks
        finished: list[_Req] = []
        tg = self.token_gen
        eos = self.config.eos_token_id
        max_len = self.config.max_model_len
        output = self._output
        for r in sampled:
            tok = tg.token(r.gen_base, r.num_output_tokens)
            r.num_tokens += 1
            r.num_output_tokens += 1
            if not r.token_free:
                r.all_token_ids.append(tok)
                if caching and r.num_tokens % bs == 0:
                    r.hasher.extend(r.all_token_ids, r.block_hashes)
            first = not r.first_token_done
            if first:
                r.first_token_done = True
                self._count_prompt(r)
            if (
                r.num_output_tokens < r.max_tokens
                and r.num_tokens < max_len
                and (r.num_output_tokens < r.min_tokens or (tok not in r.stop_ids and tok != eos))
            ):
                outputs.append(output(r, [tok], False, first))
                continue
            status = self._check_stop(r, tok)
            if status is None:  # eos with ignore_eos
                outputs.append(output(r, [tok], False, first))
                continue
            r.status = status
            finished.append(r)
            params = self._finish(r, end, hold=r.do_remote_decode)
            out = output(r, [tok], True, first)
            out.kv_transfer_params = params
            outputs.append(out)
        self._generation_tokens += len(sampled)
        finished_any = bool(finished)
        if finished_any:
            done = set(map(id, finished))
            self.running = [r for r in running if id(r) not in done]

        if not scheduled and not new_loads and not finished_any:
            self._dirty = False
        return StepResult(
            start=start,
            duration_s=duration,
            end=end,
            num_scheduled_tokens=num_tokens,
            num_prefill_tokens=n_prefill,
            num_decode_tokens=n_decode,
            outputs=outputs,
            new_remote_loads=new_loads,
            num_preempted=num_preempted,
            num_scheduled_by_request={r.request_id: n for r, n in scheduled},
        )

    def fast_forward_decode(
        self, now: float, until: float, max_steps: int | None = None
    ) -> DecodeFastForward | None:
        """Run many pure-decode steps in one call (fleet simulator); None when not applicable.

        Same state, events and timings as calling `step` once per step; see
        `pools/sim/fast_forward.py` for when it applies and where it stops (every step ends by
        `until`, no request finishes, no preemption, no admission, no lease expiry).
        """
        from pools.sim.fast_forward import fast_forward_decode

        return fast_forward_decode(self, now, until, max_steps)

    # ------------------------------------------------------------------ scheduling parts
    def _schedule_waiting(
        self,
        budget: int,
        scheduled: list[tuple[_Req, int]],
        sched_index: dict[str, int],
        new_loads: list[RemoteLoad],
        now: float,
    ) -> int:
        pool = self.block_pool
        bs = self.block_size
        caching = self.config.enable_prefix_caching
        max_seqs = self.config.max_num_seqs
        max_len_m1 = self.config.max_model_len - 1
        reserve_full = self.config.scheduler_reserve_full_isl
        waiting = self.waiting
        skipped: list[_Req] = []
        while waiting and budget > 0 and len(self.running) < max_seqs:
            r = waiting[0]
            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                skipped.append(waiting.popleft())
                continue
            hit_blocks: list[KVCacheBlock] = []
            num_local = 0
            num_ext = 0
            did_lookup = False
            load_async = False
            if r.num_computed_tokens == 0:
                did_lookup = caching and not r.skip_stats
                if caching:
                    hit_blocks = self._find_longest_cache_hit(r)
                    num_local = len(hit_blocks) * bs
                if r.do_remote_prefill:
                    num_ext = r.num_prompt_tokens - num_local
                    load_async = num_ext > 0
                    if not load_async:
                        r.do_remote_prefill = False
                num_computed = num_local + num_ext
            else:
                num_computed = r.num_computed_tokens
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
            free = pool.get_num_free_blocks() - sum(1 for b in hit_blocks if b.ref_cnt == 0)
            if reserve_full and _cdiv(min(r.num_tokens, max_len_m1 + 1), bs) - have > free:
                break  # the whole sequence must fit before admission (vLLM 0.32 default)
            if need > free:
                break
            waiting.popleft()
            if hit_blocks:
                pool.touch(hit_blocks)
                r.blocks.extend(hit_blocks)
                r.num_cached_blocks = len(hit_blocks)
            if need > 0:
                r.blocks.extend(pool.get_new_blocks(need))
            if did_lookup:
                self._record_prefix_stats(r, num_local, num_ext)
            if r.num_preemptions == 0 and not r.sources_set:
                r.sources_set = True
                r.num_local_cached_tokens = num_local
                r.num_external_tokens = num_ext
            if load_async:
                r.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                r.num_computed_tokens = num_computed
                r.do_remote_prefill = False
                r.load_result = None
                self._num_loading += 1
                load = self._make_load(r, len(hit_blocks), num_ext)
                self._loads[r.request_id] = load
                new_loads.append(load)
                skipped.append(r)
                continue
            r.num_computed_tokens = num_computed
            self._cache_blocks(r, num_computed + n)
            r.status = RequestStatus.RUNNING
            self.running.append(r)
            sched_index[r.request_id] = len(scheduled)
            scheduled.append((r, n))
            budget -= n
        if skipped:
            waiting.extendleft(reversed(skipped))
        return budget

    def _find_longest_cache_hit(self, r: _Req) -> list[KVCacheBlock]:
        max_blocks = (r.num_tokens - 1) // self.block_size
        hashes = r.block_hashes
        if max_blocks > len(hashes):
            max_blocks = len(hashes)
        get = self.block_pool.cached_block_hash_to_block.get
        hit: list[KVCacheBlock] = []
        for i in range(max_blocks):
            entry = get(hashes[i])
            if not entry:
                break
            hit.append(next(iter(entry.values())))
        return hit

    def _record_prefix_stats(self, r: _Req, num_local: int, num_ext: int) -> None:
        if r.num_preemptions > 0:
            self._pre_prefix_queries += r.num_tokens
            self._pre_prefix_hits += num_local
        else:
            self._prefix_queries += r.num_tokens
            self._prefix_hits += num_local
        if self.config.kv_connector and r.num_preemptions == 0:
            self._ext_queries += r.num_tokens - num_local
            self._ext_hits += num_ext

    def _make_load(self, r: _Req, first_block: int, num_ext: int) -> RemoteLoad:
        params = r.kv_params or KvTransferParams()
        remote_ids = params.first_group()
        local_ids = [b.block_id for b in r.blocks[first_block:]]
        return RemoteLoad(
            request_id=r.request_id,
            kv_transfer_params=params,
            remote_engine_id=params.remote_engine_id,
            remote_host=params.remote_host,
            remote_port=params.remote_port,
            remote_request_id=params.remote_request_id,
            remote_block_ids=remote_ids[first_block : first_block + len(local_ids)],
            local_block_ids=local_ids,
            num_tokens=num_ext,
            prompt_token_ids=r.all_token_ids[: r.num_prompt_tokens],
            first_block=first_block,
        )

    def _apply_finished_loads(self, now: float, outputs: list[RequestOutput]) -> None:
        """Finished loads: cache what arrived (only the last prompt token is then recomputed,
        as vLLM does to get logits), or apply `kv_load_failure_policy`."""
        loads = self._finished_loads
        self._finished_loads = []
        for r in loads:
            if self.requests.get(r.request_id) is not r:
                continue  # aborted meanwhile
            ok = r.load_result
            r.load_result = None
            if ok:
                self._cache_blocks(r, r.num_computed_tokens)
                if r.num_computed_tokens >= r.num_tokens:
                    r.num_computed_tokens = r.num_tokens - 1
                r.status = RequestStatus.PREEMPTED if r.num_preemptions else RequestStatus.WAITING
            elif self.config.kv_load_failure_policy == "recompute":
                self._free_blocks(list(reversed(r.blocks)))
                r.blocks = []
                r.num_cached_blocks = 0
                r.num_computed_tokens = 0
                r.num_external_tokens = 0
                r.sources_set = False
                r.skip_stats = True
                r.status = RequestStatus.WAITING
            else:
                self.waiting.remove(r)
                r.status = RequestStatus.FINISHED_ERROR
                self._finish(r, now, hold=False)
                outputs.append(self._output(r, [], finished=True))

    def _cache_blocks(self, r: _Req, num_tokens: int) -> None:
        """Cache r's full blocks covering its first `num_tokens` tokens (capped at known ones)."""
        if not self.config.enable_prefix_caching:
            return
        n_full = num_tokens // self.block_size
        if n_full > len(r.block_hashes):
            n_full = len(r.block_hashes)
        if n_full > r.num_cached_blocks:
            sim = r.sim
            self.block_pool.cache_full_blocks(
                r.blocks,
                r.block_hashes,
                r.num_cached_blocks,
                n_full,
                self.block_size,
                r.all_token_ids,
                r.hasher,
                lora_id=sim.lora_id,
                lora_name=sim.lora_name,
            )
            r.num_cached_blocks = n_full

    def _unschedule(
        self, r: _Req, scheduled: list[tuple[_Req, int]], sched_index: dict[str, int]
    ) -> int:
        idx = sched_index.pop(r.request_id)
        n = scheduled[idx][1]
        del scheduled[idx]
        for j in range(idx, len(scheduled)):
            sched_index[scheduled[j][0].request_id] = j
        return n

    def _preempt(self, r: _Req) -> None:
        self._free_blocks(list(reversed(r.blocks)))
        r.blocks = []
        r.num_cached_blocks = 0
        r.num_computed_tokens = 0
        r.status = RequestStatus.PREEMPTED
        r.num_preemptions += 1
        self._num_preemptions += 1
        self.waiting.appendleft(r)

    def _free_blocks(self, ordered: Sequence[KVCacheBlock]) -> None:
        self.block_pool.free_blocks(ordered)

    def _check_stop(self, r: _Req, tok: int) -> RequestStatus | None:
        if r.num_output_tokens >= r.max_tokens or r.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        if r.num_output_tokens < r.min_tokens:
            return None
        eos = self.config.eos_token_id
        if eos is not None and not r.ignore_eos and tok == eos:
            return RequestStatus.FINISHED_STOPPED
        if tok in r.stop_ids:
            r.stop_reason = tok
            return RequestStatus.FINISHED_STOPPED
        return None

    def _finish(self, r: _Req, now: float, hold: bool) -> KvTransferParams | None:
        """Retire a finished request: hold its blocks (prefill leg) or free them."""
        del self.requests[r.request_id]
        reason = r.status.finish_reason
        if reason is not None:
            self._success[reason] = self._success.get(reason, 0) + 1
        if (
            hold
            and r.blocks
            and r.status
            in (
                RequestStatus.FINISHED_STOPPED,
                RequestStatus.FINISHED_LENGTH_CAPPED,
            )
        ):
            expiry = now + self.config.kv_lease_duration_s
            self.held[r.request_id] = (r.blocks, expiry)
            self._held_blocks += len(r.blocks)
            heapq.heappush(self._lease_heap, (expiry, r.request_id))
            params = KvTransferParams(  # every key vLLM 0.32's NixlConnector returns
                do_remote_prefill=True,
                do_remote_decode=False,
                remote_block_ids=[[b.block_id for b in r.blocks]],
                remote_engine_id=self.config.engine_id,
                remote_request_id=r.request_id,
                remote_host=self.config.kv_host,
                remote_port=self.config.kv_port,
                tp_size=1,
                dcp_size=1,
                pp_size=1,
                remote_num_tokens=r.num_computed_tokens,
                remote_blocks_expiry_time=None,
                transfer_mode="pull",
                remote_prefill_cached_tokens=r.num_local_cached_tokens + r.num_external_tokens,
            )
            r.blocks = []
            return params
        if r.blocks:
            self._free_blocks(list(reversed(r.blocks)))
            r.blocks = []
        return None

    def _expire_leases(self, now: float) -> None:
        heap = self._lease_heap
        while heap and heap[0][0] <= now:
            expiry, rid = heapq.heappop(heap)
            entry = self.held.get(rid)
            if entry is not None and entry[1] == expiry:
                del self.held[rid]
                self._held_blocks -= len(entry[0])
                self._free_blocks(entry[0])
                self._dirty = True

    def _count_prompt(self, r: _Req) -> None:
        self._prompt_tokens += r.num_prompt_tokens
        local = r.num_local_cached_tokens
        ext = r.num_external_tokens
        self._by_source["local_cache_hit"] += local
        self._by_source["external_kv_transfer"] += ext
        self._by_source["local_compute"] += r.num_prompt_tokens - local - ext

    def _output(
        self, r: _Req, toks: list[int], finished: bool, first: bool = False
    ) -> RequestOutput:
        local = r.num_local_cached_tokens
        ext = r.num_external_tokens
        return RequestOutput(
            request_id=r.request_id,
            new_token_ids=toks,
            finished=finished,
            finish_reason=r.status.finish_reason if finished else None,
            stop_reason=r.stop_reason,
            num_prompt_tokens=r.num_prompt_tokens,
            num_output_tokens=r.num_output_tokens,
            is_first_token=first,
            num_cached_tokens=local + ext,
            num_local_cached_tokens=local,
            num_external_tokens=ext,
            num_local_compute_tokens=r.num_prompt_tokens - local - ext,
            num_preemptions=r.num_preemptions,
        )

    # ------------------------------------------------------------------ stats
    def stats(self) -> EngineStats:
        n_loading = self._num_loading + len(self._finished_loads)
        return EngineStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_waiting_for_remote_kvs=n_loading,
            kv_cache_usage=self.block_pool.get_usage(),
            prefix_cache_queries=self._prefix_queries,
            prefix_cache_hits=self._prefix_hits,
            preempted_prefix_cache_queries=self._pre_prefix_queries,
            preempted_prefix_cache_hits=self._pre_prefix_hits,
            external_prefix_cache_queries=self._ext_queries,
            external_prefix_cache_hits=self._ext_hits,
            num_preemptions=self._num_preemptions,
            prompt_tokens=self._prompt_tokens,
            prompt_tokens_by_source=dict(self._by_source),
            generation_tokens=self._generation_tokens,
            request_success=dict(self._success),
            num_held_requests=len(self.held),
            num_held_blocks=self._held_blocks,
            num_gpu_blocks=self.block_pool.num_gpu_blocks,
            block_size=self.block_size,
            busy_until=self.busy_until,
            num_steps=self._num_steps,
        )
