"""The engine's counters: one mutable set the scheduler advances, one snapshot everybody reads.

`EngineCounters` is the only copy of the cumulative counters (vLLM's `SchedulerStats` /
`PrefixCacheStats` roles): the `Scheduler` and its `KVCacheManager` add to it, and
`EngineCore.stats()` returns an `EngineStats` snapshot built from it plus the gauges. The sim
server's `/metrics` (`pools/sim/metrics.py`), the fleet simulator and the fidelity replay read
that snapshot; none keeps a counter of its own for what the engine counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass(slots=True)
class EngineCounters:
    """Cumulative counters (tokens unless named otherwise); see README "API" for the vLLM metric
    each backs. `preempted_prefix_cache_*`: re-lookups of preempted requests, which vLLM keeps
    out of `prefix_cache_*`."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    preempted_prefix_cache_queries: int = 0
    preempted_prefix_cache_hits: int = 0
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    num_preemptions: int = 0
    prompt_tokens: int = 0
    prompt_tokens_by_source: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(PROMPT_SOURCES, 0)
    )
    generation_tokens: int = 0
    request_success: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0)
    )
    num_steps: int = 0

    def count_prompt(self, num_prompt: int, num_local: int, num_external: int) -> None:
        """A request's prompt, counted once at its first token, by where its tokens came from."""
        self.prompt_tokens += num_prompt
        by_source = self.prompt_tokens_by_source
        by_source["local_cache_hit"] += num_local
        by_source["external_kv_transfer"] += num_external
        by_source["local_compute"] += num_prompt - num_local - num_external


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
    num_free_blocks: int = 0  # usable blocks free now (`num_gpu_blocks - 1` when idle)
