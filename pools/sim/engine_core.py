"""The simulated engine core: the public face of one engine, clock-injected (vLLM's `EngineCore`).

Pure: no sleeps, no sockets, no global clock. Every time-dependent call takes `now` (seconds).
`step(now)` runs one engine step and returns how long it took (from the `TimingModel`) and what
it produced; the caller advances its clock (`pools/sim/driver.py` is the one loop that does).

The parts, as in vLLM v1 (same names where they fit):

- `Scheduler` (`scheduler.py`): queues, one step's decisions, sampling and stop checks,
  and the decode fast-forward mode;
- `KVCacheManager` (`kv_cache_manager.py`) over the `BlockPool` (`block_pool.py`): prefix
  lookup, allocation, caching, eviction, KV events;
- `ConnectorState` (`kv_connector.py`): P/D remote loads and held blocks under leases
  (`transfer.lease.LeaseTable`);
- outputs (`outputs.py`) and the one set of counters (`stats.py`).

This class wires them and times each step (the `TimingModel` stands in for the model executor:
`schedule` -> `step_time` -> `update_from_output`, as vLLM's `EngineCore.step`).
"""

from __future__ import annotations

from collections import deque

from pools.sim.block_pool import BlockPool
from pools.sim.config import EngineConfig
from pools.sim.kv_events import KVCacheEvent
from pools.sim.outputs import DecodeFastForward, RemoteLoad, RequestOutput, StepResult
from pools.sim.request import Request, SimRequest
from pools.sim.scheduler import Scheduler
from pools.sim.stats import FINISH_REASONS, PROMPT_SOURCES, EngineStats
from pools.sim.timing import TimingModel

__all__ = [
    "FINISH_REASONS",
    "PROMPT_SOURCES",
    "DecodeFastForward",
    "EngineCore",
    "EngineStats",
    "RemoteLoad",
    "RequestOutput",
    "StepResult",
]


class EngineCore:
    """See the module docstring and pools/sim/README.md ("API")."""

    def __init__(self, config: EngineConfig, timing: TimingModel) -> None:
        self.config = config
        self.timing = timing
        self.block_size = config.block_size
        num_blocks = config.num_gpu_blocks or timing.num_gpu_blocks(config.block_size)
        self.scheduler = Scheduler(config, num_blocks, config.vocab_size or timing.model.vocab_size)
        self.block_pool: BlockPool = self.scheduler.kv_cache_manager.block_pool

    # ------------------------------------------------------------------ views
    @property
    def busy_until(self) -> float:
        """When the step in progress ends (-inf before the first step)."""
        return self.scheduler.busy_until

    @property
    def requests(self) -> dict[str, Request]:
        return self.scheduler.requests

    @property
    def running(self) -> list[Request]:
        return self.scheduler.running

    @property
    def waiting(self) -> deque[Request]:
        return self.scheduler.waiting

    # ------------------------------------------------------------------ requests in/out
    def add_request(self, req: SimRequest, now: float) -> None:
        """Queue a request (FCFS). Raises ValueError naming the bad field."""
        self.scheduler.add_request(req)

    def abort_request(self, request_id: str, now: float) -> RequestOutput | None:
        """Finish a request with `"abort"` and free its blocks; None if not in the engine."""
        return self.scheduler.abort_request(request_id, now)

    def release_held(self, request_id: str, now: float) -> bool:
        """Free the blocks a finished prefill-leg request holds (its KV was pulled)."""
        return self.scheduler.release_held(request_id)

    def extend_lease(self, request_id: str, now: float) -> bool:
        """Push a held request's lease to `now + kv_lease_duration_s` (the decode side's
        heartbeat in vLLM's NixlConnector). False if nothing is held for it."""
        return self.scheduler.connector.extend(request_id, now)

    def pending_remote_loads(self) -> list[RemoteLoad]:
        """Remote loads admitted and not finished yet (idempotent view)."""
        return list(self.scheduler.connector.loads.values())

    def finish_remote_load(self, request_id: str, ok: bool, now: float) -> None:
        """The caller's transfer for `request_id` ended; applied at the next `step`."""
        self.scheduler.finish_remote_load(request_id, ok)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash (AllBlocksCleared); False while blocks are in use (vLLM)."""
        return self.scheduler.reset_prefix_cache()

    def drain_events(self) -> list[KVCacheEvent]:
        """KV events since the last drain, in the order state changed."""
        return self.scheduler.kv_cache_manager.take_events()

    # ------------------------------------------------------------------ clock
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def next_step_time(self, now: float) -> float | None:
        """When to call `step` next (None: nothing to do until a new call into the core)."""
        return self.scheduler.next_step_time(now)

    def step(self, now: float) -> StepResult:
        """Run one engine step starting at `max(now, busy_until)`; see `scheduler.py`."""
        so = self.scheduler.schedule(now)
        duration = self.timing.step_time(
            so.num_scheduled_tokens,
            len(so.scheduled),
            so.attn_ctx_tokens,
            so.kv_read_tokens,
            num_new_seqs=so.num_new_seqs,
        )
        return self.scheduler.update_from_output(so, duration)

    def fast_forward_decode(
        self, now: float, until: float, max_steps: int | None = None
    ) -> DecodeFastForward | None:
        """Run many pure-decode steps in one call (the scheduler's fast-forward mode); None
        when it does not apply. Same state, events and timings as calling `step` once per
        step (`Scheduler.fast_forward_decode`)."""
        return self.scheduler.fast_forward_decode(now, until, self.timing.step_time, max_steps)

    # ------------------------------------------------------------------ stats
    def stats(self) -> EngineStats:
        """A snapshot of the gauges and of the one set of counters (`stats.py`)."""
        s = self.scheduler
        c = s.counters
        kv = s.kv_cache_manager
        leases = s.connector.leases
        return EngineStats(
            num_running=len(s.running),
            num_waiting=len(s.waiting),
            num_waiting_for_remote_kvs=s.connector.num_waiting_for_remote_kvs,
            kv_cache_usage=kv.usage(),
            prefix_cache_queries=c.prefix_cache_queries,
            prefix_cache_hits=c.prefix_cache_hits,
            preempted_prefix_cache_queries=c.preempted_prefix_cache_queries,
            preempted_prefix_cache_hits=c.preempted_prefix_cache_hits,
            external_prefix_cache_queries=c.external_prefix_cache_queries,
            external_prefix_cache_hits=c.external_prefix_cache_hits,
            num_preemptions=c.num_preemptions,
            prompt_tokens=c.prompt_tokens,
            prompt_tokens_by_source=dict(c.prompt_tokens_by_source),
            generation_tokens=c.generation_tokens,
            request_success=dict(c.request_success),
            num_held_requests=len(leases),
            num_held_blocks=leases.blocks_held,
            num_gpu_blocks=kv.block_pool.num_gpu_blocks,
            block_size=self.block_size,
            busy_until=s.busy_until,
            num_steps=c.num_steps,
            num_free_blocks=kv.num_free_blocks(),
        )
