"""`EngineScrapeSource`: the engines' own `/metrics` pages → an `Observation`.

Reads vLLM's names (the simulated engine serves the same):

- per replica (every pool): `vllm:num_requests_running`, `vllm:num_requests_waiting`,
  `vllm:kv_cache_usage_perc` (mean over engines), KV capacity = `num_gpu_blocks` x
  `block_size` of `vllm:cache_config_info`;
- TTFT: `vllm:time_to_first_token_seconds` of the prefill pool (what the prefill replicas
  deliver, without the KV transfer and the decode's first step);
- ITL: `vllm:inter_token_latency_seconds` of the decode pool (per token, not per request);
- arrivals: `vllm:request_success_total` of the decode pool (every request ends there);
- ISL / OSL: `_sum / _count` of `vllm:request_prompt_tokens` and
  `vllm:request_generation_tokens`, decode pool;
- prefix hit rate: `vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total` of the
  prefill pool (of every replica when the prefill pool saw no query);
- the prefill leg (`Observation.prefill_leg`, the online fit's `prefill-leg` signal): the same
  prefill-pool TTFT histogram (a prefill engine's first token ends its leg: arrival at the
  engine to the prefill's end), its uncached tokens = the prefill pool's mean
  `vllm:request_prompt_tokens` x (1 - the hit rate).

Window: since the last call (see `base.py`), per replica: each replica's counters and buckets
are differenced against that replica's previous read, then summed over the pool, so a
replica that joined in between counts from its first read on. `pools[p].ready` is the
number of the pool's targets that answered; pending / draining are not an engine's to know
(0). `targets` may be replaced between calls (`CoordinatorSource` does, from
`/admin/pools`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import httpx

from autoscale.metrics_sources.base import SCRAPE_TIMEOUT_S, MetricsSource, MetricsSourceError
from autoscale.metrics_sources.exposition import Page, parse_page
from autoscale.metrics_sources.histogram import CumulativeHistogram, total
from autoscale.metrics_sources.window import delta, mean_or_zero
from autoscale.signals import LatencySummary, Observation, Pool, PoolStatus, ReplicaSignals
from pools.http_client import http_client

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
CACHE_CONFIG = "vllm:cache_config_info"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
SUCCESS = "vllm:request_success"
PROMPT = "vllm:request_prompt_tokens"
GENERATION = "vllm:request_generation_tokens"
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"
FAMILIES = (
    RUNNING,
    WAITING,
    KV_USAGE,
    CACHE_CONFIG,
    TTFT,
    ITL,
    SUCCESS,
    PROMPT,
    GENERATION,
    PREFIX_QUERIES,
    PREFIX_HITS,
)


@dataclass(frozen=True, slots=True)
class EngineTarget:
    """One engine to scrape: its id, its pool, its `/metrics` URL."""

    replica_id: str
    pool: Pool
    metrics_url: str


@dataclass(frozen=True, slots=True)
class EngineRead:
    """One engine's cumulative counters at one read (what the next window differences)."""

    success: float
    prefix_queries: float
    prefix_hits: float
    ttft: CumulativeHistogram
    itl: CumulativeHistogram
    prompt: CumulativeHistogram
    generation: CumulativeHistogram


def engine_read(page: Page) -> EngineRead:
    return EngineRead(
        success=page.value(SUCCESS + "_total"),
        prefix_queries=page.value(PREFIX_QUERIES + "_total"),
        prefix_hits=page.value(PREFIX_HITS + "_total"),
        ttft=page.histogram(TTFT),
        itl=page.histogram(ITL),
        prompt=page.histogram(PROMPT),
        generation=page.histogram(GENERATION),
    )


def replica_signals(target: EngineTarget, page: Page) -> ReplicaSignals:
    """The replica's load gauges at the read."""
    kv = [s.value for s in page.samples if s.name == KV_USAGE]
    capacity = 0
    for s in page.samples:
        if s.name == CACHE_CONFIG:
            blocks, size = s.labels.get("num_gpu_blocks", ""), s.labels.get("block_size", "")
            if blocks.isdigit() and size.isdigit():
                capacity += int(blocks) * int(size)
    return ReplicaSignals(
        replica_id=target.replica_id,
        pool=target.pool,
        num_running=int(page.value(RUNNING)),
        num_waiting=int(page.value(WAITING)),
        kv_usage=min(1.0, max(0.0, sum(kv) / len(kv))) if kv else 0.0,
        kv_capacity_tokens=capacity,
    )


@dataclass(frozen=True, slots=True)
class EngineWindow:
    """One replica's increase over the window."""

    pool: Pool
    success: float
    prefix_queries: float
    prefix_hits: float
    ttft: CumulativeHistogram
    itl: CumulativeHistogram
    prompt: CumulativeHistogram
    generation: CumulativeHistogram


def engine_window(pool: Pool, current: EngineRead, previous: EngineRead | None) -> EngineWindow:
    if previous is None:  # first read of this replica: its history is not this window's
        previous = current
    return EngineWindow(
        pool=pool,
        success=delta(current.success, previous.success),
        prefix_queries=delta(current.prefix_queries, previous.prefix_queries),
        prefix_hits=delta(current.prefix_hits, previous.prefix_hits),
        ttft=current.ttft.minus(previous.ttft),
        itl=current.itl.minus(previous.itl),
        prompt=current.prompt.minus(previous.prompt),
        generation=current.generation.minus(previous.generation),
    )


def prefix_hit_rate(windows: Sequence[EngineWindow]) -> float:
    """Hits / queries over the prefill pool's replicas (all replicas if it saw no query)."""
    prefill = [w for w in windows if w.pool is Pool.PREFILL]
    for group in (prefill, windows):
        queries = sum(w.prefix_queries for w in group)
        if queries > 0:
            return min(1.0, sum(w.prefix_hits for w in group) / queries)
    return 0.0


def engines_observation(
    now: float,
    window_s: float,
    replicas: Sequence[ReplicaSignals],
    windows: Sequence[EngineWindow],
    pools: dict[Pool, PoolStatus] | None = None,
) -> Observation:
    """The pure reduction (see the module docstring)."""
    decode = [w for w in windows if w.pool is Pool.DECODE]
    prefill = [w for w in windows if w.pool is Pool.PREFILL]
    finished = sum(w.success for w in decode)
    prompt = total(w.prompt for w in decode)
    generation = total(w.generation for w in decode)
    ttft = total(w.ttft for w in prefill)
    leg_prompt = total(w.prompt for w in prefill)
    hit_rate = prefix_hit_rate(windows)
    itl = total(w.itl for w in decode)
    if pools is None:
        pools = {p: PoolStatus(ready=sum(1 for r in replicas if r.pool is p)) for p in Pool}
    first = window_s <= 0
    return Observation(
        now=now,
        window_s=max(0.0, window_s),
        pools=pools,
        num_requests=0 if first else round(finished),
        arrival_rps=0.0 if first else finished / window_s,
        mean_isl_tokens=mean_or_zero(prompt.sum, prompt.count),
        mean_osl_tokens=mean_or_zero(generation.sum, generation.count),
        prefix_hit_rate=hit_rate,
        ttft=LatencySummary() if first else ttft.summary(),
        itl=LatencySummary() if first else itl.summary(),
        replicas=tuple(replicas),
        prefill_leg=LatencySummary() if first or not ttft.count else ttft.summary(),
        prefill_leg_uncached_tokens=mean_or_zero(leg_prompt.sum, leg_prompt.count)
        * (1.0 - hit_rate),
    )


class EngineScrapeSource(MetricsSource):
    """Scrapes every target's `/metrics` concurrently (see the module docstring).

    A target that does not answer is left out of this observation (and of `ready`) and keeps
    its previous read, so its next window spans both ticks. Raises `MetricsSourceError` only
    when targets exist and none answered.
    """

    name = "engines"

    def __init__(
        self,
        targets: Iterable[EngineTarget] = (),
        *,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = SCRAPE_TIMEOUT_S,
    ) -> None:
        self.targets: list[EngineTarget] = list(targets)
        self._own_client = client is None
        self.client = client or http_client(timeout=timeout_s)
        self.timeout_s = timeout_s
        self._reads: dict[str, EngineRead] = {}
        self._last_now: float | None = None

    async def _page(self, target: EngineTarget) -> Page | None:
        try:
            response = await self.client.get(target.metrics_url, timeout=self.timeout_s)
            response.raise_for_status()
            return parse_page(response.text, FAMILIES)
        except (httpx.HTTPError, ValueError):
            return None

    async def observe(self, now: float) -> Observation:
        targets = list(self.targets)
        pages = await asyncio.gather(*(self._page(t) for t in targets))
        if targets and all(p is None for p in pages):
            raise MetricsSourceError(f"no engine answered /metrics ({len(targets)} targets)")
        window_s = 0.0 if self._last_now is None else now - self._last_now
        replicas: list[ReplicaSignals] = []
        windows: list[EngineWindow] = []
        for target, page in zip(targets, pages, strict=True):
            if page is None:
                continue
            read = engine_read(page)
            replicas.append(replica_signals(target, page))
            windows.append(engine_window(target.pool, read, self._reads.get(target.replica_id)))
            self._reads[target.replica_id] = read
        self._last_now = now
        return engines_observation(now, window_s, replicas, windows)

    async def aclose(self) -> None:
        if self._own_client:
            await self.client.aclose()
