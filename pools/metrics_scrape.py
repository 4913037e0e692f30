"""`/metrics` scraping: vLLM's Prometheus text → a `ReplicaMetrics` snapshot per replica.

`parse_vllm_metrics` is pure (text and `now` in, snapshot out); `MetricsScraper` is the thin
loop that fetches every replica's page with one shared `httpx.AsyncClient` or
`aiohttp.ClientSession` (the coordinator's legs session: httpx's request machinery was most of a
scrape's CPU, ~3% of the coordinator's at C=1 in the proxy bench) and hands the
snapshot to `Fleet.observe_metrics`, which fires `ReplicaMetricsUpdated` (the coordinator feeds
it to `TokenLoad.observe_metrics`).

Read (vLLM 0.32 names, also served by the simulated engine):
`vllm:num_requests_running`, `vllm:num_requests_waiting` (gauges, summed over engines),
`vllm:kv_cache_usage_perc` (gauge 0..1, mean over engines), `vllm:prefix_cache_queries_total`,
`vllm:prefix_cache_hits_total` (counters in tokens, summed), and the `num_gpu_blocks` /
`block_size` labels of `vllm:cache_config_info` when present. A vLLM page is mostly histogram
buckets, so lines of other metrics are dropped before the Prometheus parser sees them
(`pools.prometheus_text.relevant_lines`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
import httpx
from pydantic import BaseModel, ConfigDict, Field

from pools.fleet import Fleet
from pools.periodic import PeriodicLoop
from pools.prometheus_text import relevant_lines
from pools.replica import Replica, ReplicaMetrics

log = logging.getLogger(__name__)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
CACHE_CONFIG = "vllm:cache_config_info"
_WANTED = (RUNNING, WAITING, KV_USAGE, PREFIX_QUERIES, PREFIX_HITS, CACHE_CONFIG)
_FAMILIES = {
    RUNNING: RUNNING,
    WAITING: WAITING,
    KV_USAGE: KV_USAGE,
    PREFIX_QUERIES: "vllm:prefix_cache_queries",
    PREFIX_HITS: "vllm:prefix_cache_hits",
    CACHE_CONFIG: CACHE_CONFIG,
}


class MetricsSettings(BaseModel):
    """Scrape loop timing (the fleet config's `metrics:` block)."""

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(
        default=1.0, gt=0, le=600, description="Seconds between scrape rounds."
    )
    timeout_s: float = Field(
        default=1.0, gt=0, le=60, description="Timeout of one /metrics request."
    )


def _int_label(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def parse_vllm_metrics(text: str, now: float) -> ReplicaMetrics:
    """Reduce a vLLM `/metrics` page to a `ReplicaMetrics` (missing metrics read 0 / None).

    Raises ValueError if the page is not Prometheus text.
    """
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = dict.fromkeys(_WANTED, 0.0)
    kv_samples: list[float] = []
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    for family in text_string_to_metric_families(relevant_lines(text, _FAMILIES.values())):
        for sample in family.samples:
            if sample.name == KV_USAGE:
                kv_samples.append(float(sample.value))
            elif sample.name == CACHE_CONFIG:
                blocks = _int_label(sample.labels.get("num_gpu_blocks"))
                if blocks is not None:
                    num_gpu_blocks = (num_gpu_blocks or 0) + blocks
                block_size = _int_label(sample.labels.get("block_size")) or block_size
            elif sample.name in sums:
                sums[sample.name] += float(sample.value)
    kv_usage = sum(kv_samples) / len(kv_samples) if kv_samples else 0.0
    return ReplicaMetrics(
        num_running=int(sums[RUNNING]),
        num_waiting=int(sums[WAITING]),
        kv_usage=min(1.0, max(0.0, kv_usage)),
        prefix_cache_queries=sums[PREFIX_QUERIES],
        prefix_cache_hits=sums[PREFIX_HITS],
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        scraped_at=now,
    )


class MetricsScraper(PeriodicLoop):
    """Scrapes every replica's `/metrics` every `interval_s` into the fleet.

    A failed scrape is logged at debug level and skipped: health is the health checker's job,
    and a replica whose metrics are stale keeps its last snapshot (with its `scraped_at`).
    """

    def __init__(
        self,
        fleet: Fleet,
        client: httpx.AsyncClient | aiohttp.ClientSession,
        interval_s: float = 1.0,
        timeout_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fleet = fleet
        self.client = client
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.scrapes = 0
        self.failures = 0
        super().__init__()

    @classmethod
    def from_config(
        cls,
        fleet: Fleet,
        client: httpx.AsyncClient | aiohttp.ClientSession,
        settings: MetricsSettings,
    ) -> MetricsScraper:
        return cls(fleet, client, interval_s=settings.interval_s, timeout_s=settings.timeout_s)

    async def scrape(self, replica: Replica) -> ReplicaMetrics | None:
        """Fetch and parse one replica's page (None on any failure)."""
        client = self.client
        try:
            if isinstance(client, aiohttp.ClientSession):
                text = await self._fetch_aiohttp(client, replica)
            else:
                response = await client.get(
                    replica.endpoint.metrics_endpoint, timeout=self.timeout_s
                )
                response.raise_for_status()
                text = response.text
            return parse_vllm_metrics(text, self.clock())
        except (httpx.HTTPError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.failures += 1
            log.debug("metrics scrape of %s failed: %r", replica.replica_id, exc)
            return None

    async def _fetch_aiohttp(self, session: aiohttp.ClientSession, replica: Replica) -> str:
        # per phase, as httpx's `timeout=`: connect, then each read (not a total)
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.timeout_s, sock_read=self.timeout_s
        )
        async with session.get(replica.endpoint.metrics_endpoint, timeout=timeout) as response:
            response.raise_for_status()
            return await response.text()

    async def scrape_once(self) -> int:
        """Scrape every replica once, concurrently; returns how many scrapes succeeded."""
        replicas = self.fleet.replicas()
        results = await asyncio.gather(*(self.scrape(r) for r in replicas))
        ok = 0
        for replica, metrics in zip(replicas, results, strict=True):
            if metrics is not None:
                ok += 1
                self.fleet.observe_metrics(replica.replica_id, metrics)
        self.scrapes += 1
        return ok

    async def run_once(self) -> None:
        await self.scrape_once()
