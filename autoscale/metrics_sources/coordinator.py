"""`CoordinatorSource`: a coordinator's own `/metrics` and `/admin/pools` → an `Observation`.

What clients saw, from pdorch's histograms (`pdorch/app/metrics.py`), summed over every
series (all pools, replicas and routes):

- TTFT: `pdorch_time_to_first_token_seconds` (streamed requests, arrival to first byte);
- ITL: `pdorch_inter_token_latency_seconds` (one per completed stream: its mean gap);
- arrivals and mean ISL: `pdorch_request_prompt_tokens` (`_count`, `_sum / _count`);
- mean OSL: `pdorch_request_generation_tokens` (`_sum / _count`).

Pools from `/admin/pools` (admin token as `Authorization: Bearer`): per pool, `ready` =
routable replicas, `pending` / `draining` = replicas in those states (unhealthy ones count
as neither). Per-replica signals, the prefix hit rate and the prefill leg
(`Observation.prefill_leg`: the prefill engines' own TTFT): with `engines=True` (default) from
an `EngineScrapeSource` over the replicas `/admin/pools` lists (their `metrics_url`), else
from the coordinator's own gauges (`pdorch_replica_requests_in_flight` as `num_running`,
`pdorch_replica_kv_usage`) and no hit rate. Either way each replica's token load comes from
the coordinator (`pdorch_replica_prefill_tokens_queued` as `queued_prefill_tokens`,
`pdorch_replica_decode_blocks` x block size as `decode_kv_tokens`). Window: since the last
call (see `base.py`). `model`: one model of a several-model coordinator (`models:` in the
fleet file): both reads carry `?model=NAME`, so the observation is that model's alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

import httpx

from autoscale.metrics_sources.base import SCRAPE_TIMEOUT_S, MetricsSource, MetricsSourceError
from autoscale.metrics_sources.engines import EngineScrapeSource, EngineTarget
from autoscale.metrics_sources.exposition import Page, parse_page
from autoscale.metrics_sources.histogram import CumulativeHistogram
from autoscale.metrics_sources.window import mean_or_zero, pool_of
from autoscale.signals import LatencySummary, Observation, Pool, PoolStatus, ReplicaSignals
from pools.http_client import http_client

TTFT = "pdorch_time_to_first_token_seconds"
ITL = "pdorch_inter_token_latency_seconds"
PROMPT = "pdorch_request_prompt_tokens"
GENERATION = "pdorch_request_generation_tokens"
IN_FLIGHT = "pdorch_replica_requests_in_flight"
KV_USAGE = "pdorch_replica_kv_usage"
PREFILL_QUEUED = "pdorch_replica_prefill_tokens_queued"
DECODE_BLOCKS = "pdorch_replica_decode_blocks"
FAMILIES = (TTFT, ITL, PROMPT, GENERATION, IN_FLIGHT, KV_USAGE, PREFILL_QUEUED, DECODE_BLOCKS)


@dataclass(frozen=True, slots=True)
class CoordinatorRead:
    """The coordinator's cumulative request histograms at one read."""

    ttft: CumulativeHistogram
    itl: CumulativeHistogram
    prompt: CumulativeHistogram
    generation: CumulativeHistogram

    @classmethod
    def of(cls, page: Page) -> CoordinatorRead:
        return cls(
            page.histogram(TTFT),
            page.histogram(ITL),
            page.histogram(PROMPT),
            page.histogram(GENERATION),
        )

    def minus(self, earlier: CoordinatorRead) -> CoordinatorRead:
        return CoordinatorRead(
            self.ttft.minus(earlier.ttft),
            self.itl.minus(earlier.itl),
            self.prompt.minus(earlier.prompt),
            self.generation.minus(earlier.generation),
        )


def pool_status(view: Mapping[str, Any]) -> dict[Pool, PoolStatus]:
    """Ready / pending / draining per planner pool from a `/admin/pools` answer."""
    out: dict[Pool, PoolStatus] = {}
    for name, pool_view in view.get("pools", {}).items():
        pool = pool_of(name)
        if pool is None:
            continue
        rows = pool_view.get("replicas", [])
        out[pool] = PoolStatus(
            ready=sum(1 for r in rows if r.get("routable")),
            pending=sum(1 for r in rows if r.get("state") == "pending"),
            draining=sum(1 for r in rows if r.get("state") == "draining"),
        )
    return out


def engine_targets(view: Mapping[str, Any]) -> list[EngineTarget]:
    """Every replica of a planner pool that is not unhealthy, as a scrape target."""
    targets = []
    for name, pool_view in view.get("pools", {}).items():
        pool = pool_of(name)
        if pool is None:
            continue
        for r in pool_view.get("replicas", []):
            if r.get("state") == "unhealthy":
                continue
            url = r.get("metrics_url") or f"{str(r['url']).rstrip('/')}/metrics"
            targets.append(EngineTarget(str(r["id"]), pool, url))
    return targets


def gauge_replicas(page: Page) -> list[ReplicaSignals]:
    """Per-replica signals from the coordinator's own gauges (no engine scrape)."""
    in_flight = page.values(IN_FLIGHT, ("pool", "replica"))
    kv = page.values(KV_USAGE, ("pool", "replica"))
    out = []
    for pool_name, replica_id in sorted(set(in_flight) | set(kv)):
        pool = pool_of(pool_name)
        if pool is None:
            continue
        key = (pool_name, replica_id)
        out.append(
            ReplicaSignals(
                replica_id=replica_id,
                pool=pool,
                num_running=int(in_flight.get(key, 0)),
                kv_usage=kv.get(key, 0.0),
            )
        )
    return out


def with_token_load(
    replicas: tuple[ReplicaSignals, ...], page: Page, block_size: int
) -> tuple[ReplicaSignals, ...]:
    """Add the coordinator's token load (`queued_prefill_tokens`, `decode_kv_tokens` =
    decode blocks x block size) to each replica's signals."""
    queued = page.values(PREFILL_QUEUED, ("replica",))
    blocks = page.values(DECODE_BLOCKS, ("replica",))
    return tuple(
        replace(
            r,
            queued_prefill_tokens=round(queued.get((r.replica_id,), 0.0)),
            decode_kv_tokens=round(blocks.get((r.replica_id,), 0.0) * block_size),
        )
        for r in replicas
    )


def coordinator_observation(
    now: float,
    window_s: float,
    window: CoordinatorRead | None,
    pools: dict[Pool, PoolStatus],
    replicas: tuple[ReplicaSignals, ...],
    prefix_hit_rate: float,
) -> Observation:
    """The pure reduction; `window` None (or `window_s` 0) is the priming call."""
    if window is None or window_s <= 0:
        return Observation(
            now=now,
            window_s=0.0,
            pools=pools,
            prefix_hit_rate=prefix_hit_rate,
            replicas=replicas,
        )
    arrivals = window.prompt.count
    return Observation(
        now=now,
        window_s=window_s,
        pools=pools,
        num_requests=round(arrivals),
        arrival_rps=arrivals / window_s,
        mean_isl_tokens=mean_or_zero(window.prompt.sum, arrivals),
        mean_osl_tokens=mean_or_zero(window.generation.sum, window.generation.count),
        prefix_hit_rate=prefix_hit_rate,
        ttft=window.ttft.summary() if window.ttft.count else LatencySummary(),
        itl=window.itl.summary() if window.itl.count else LatencySummary(),
        replicas=replicas,
    )


class CoordinatorSource(MetricsSource):
    """Reads one coordinator (see the module docstring)."""

    name = "coordinator"

    def __init__(
        self,
        url: str,
        *,
        admin_token: str | None = None,
        engines: bool = True,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = SCRAPE_TIMEOUT_S,
        model: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        # a several-model coordinator: read this model's `/metrics` and `/admin/pools` only
        self.query = "?" + urlencode({"model": model}) if model else ""
        self.admin_token = admin_token
        self._own_client = client is None
        self.client = client or http_client(timeout=timeout_s)
        self.timeout_s = timeout_s
        self.engines = (
            EngineScrapeSource(client=self.client, timeout_s=timeout_s) if engines else None
        )
        self._previous: CoordinatorRead | None = None
        self._last_now: float | None = None

    async def _get(self, path: str, admin: bool = False) -> httpx.Response:
        headers = (
            {"authorization": f"Bearer {self.admin_token}"} if admin and self.admin_token else {}
        )
        try:
            response = await self.client.get(
                self.url + path + self.query, headers=headers, timeout=self.timeout_s
            )
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise MetricsSourceError(f"{self.url}{path}: {exc!r}") from exc
        return response

    async def observe(self, now: float) -> Observation:
        metrics, pools_answer = await asyncio.gather(
            self._get("/metrics"), self._get("/admin/pools", admin=True)
        )
        try:
            page = parse_page(metrics.text, FAMILIES)
            view = pools_answer.json()
        except ValueError as exc:
            raise MetricsSourceError(f"{self.url}: unreadable answer: {exc}") from exc
        read = CoordinatorRead.of(page)
        pools = pool_status(view)
        engine_obs: Observation | None = None
        if self.engines is not None:
            self.engines.targets = engine_targets(view)
            engine_obs = await self.engines.observe(now)
            replicas, hit_rate = engine_obs.replicas, engine_obs.prefix_hit_rate
        else:
            replicas, hit_rate = tuple(gauge_replicas(page)), 0.0
        replicas = with_token_load(replicas, page, int(view.get("block_size") or 0))
        window = None if self._previous is None else read.minus(self._previous)
        window_s = 0.0 if self._last_now is None else now - self._last_now
        self._previous, self._last_now = read, now
        obs = coordinator_observation(now, window_s, window, pools, replicas, hit_rate)
        if engine_obs is not None and obs.window_s > 0:
            obs = replace(
                obs,
                prefill_leg=engine_obs.prefill_leg,
                prefill_leg_uncached_tokens=engine_obs.prefill_leg_uncached_tokens,
            )
        return obs

    async def aclose(self) -> None:
        if self._own_client:
            await self.client.aclose()
