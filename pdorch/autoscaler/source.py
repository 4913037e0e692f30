"""What the live control loop observes: a metrics source with the actuator's pool counts.

The loop's `Observation` is built from two parts:

- the **load and latencies** from a source of `autoscale/metrics_sources/`: per window the
  arrivals, mean ISL / OSL, prefix hit rate, TTFT / ITL percentiles and per-replica signals
  (`num_running`, `num_waiting`, KV usage, queued prefill tokens, decode KV tokens):
  - `coordinator` (default): `CoordinatorSource` over the coordinator's `/metrics` histograms
    and `/admin/pools`, each engine's `/metrics` scraped (window: since the last read; the
    first read primes it and carries no requests: `window_s` 0);
  - `prometheus`: `PrometheusSource`, PromQL over a Prometheus that scrapes the fleet
    (`deploy/prometheus/`), a fixed lookback of `window_s` every read;
- the **pool counts** (`ready` / `pending` / `draining`) from the coordinator's scaling view,
  i.e. the actuator's `current()`: `GET /admin/autoscale` (`AdminCounts`, `pdorch autoscale`)
  or `ScalingControl` in the same process (`ActuatorCounts`, `pdorch serve --slo-policy`).
  They replace the source's own counts (`WithPoolCounts`) because the actuator is the
  authority on what it started: a replica whose process is still starting is `pending` there
  before the fleet (and so `/admin/pools` or Prometheus) lists it, and without it the planner
  would order the same replica again on the next tick.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

import httpx

from autoscale.metrics_sources.base import MetricsSource, MetricsSourceError
from autoscale.metrics_sources.coordinator import CoordinatorSource
from autoscale.metrics_sources.prometheus import PrometheusSource
from autoscale.metrics_sources.window import pool_of
from autoscale.signals import Observation, Pool, PoolStatus
from pools.http_client import http_client

METRICS_KINDS = ("coordinator", "prometheus")


class PoolCounts(Protocol):
    """Ready / pending / draining per planner pool, as the actuator sees them now."""

    async def read(self) -> dict[Pool, PoolStatus]: ...

    async def aclose(self) -> None: ...


def counts_of(pools: Mapping[str, Mapping[str, Any]]) -> dict[Pool, PoolStatus]:
    """The planner pools of a `{pool: {ready, pending, draining}}` view (other pools dropped)."""
    out: dict[Pool, PoolStatus] = {}
    for name, row in pools.items():
        pool = pool_of(str(name))
        if pool is not None:
            out[pool] = PoolStatus(
                ready=int(row["ready"]), pending=int(row["pending"]), draining=int(row["draining"])
            )
    return out


class AdminCounts:
    """The counts of `GET /admin/autoscale` (the coordinator's actuator), over HTTP."""

    def __init__(
        self,
        url: str,
        admin_token: str | None,
        timeout_s: float = 10.0,
        model: str | None = None,
    ) -> None:
        headers = {"authorization": f"Bearer {admin_token}"} if admin_token else {}
        params = {"model": model} if model else None  # one model of a several-model fleet
        self.client = http_client(
            base_url=url.rstrip("/"), headers=headers, params=params, timeout=timeout_s
        )

    async def read(self) -> dict[Pool, PoolStatus]:
        try:
            answer = (await self.client.get("/admin/autoscale")).raise_for_status()
            return counts_of(answer.json()["pools"])
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise MetricsSourceError(f"{self.client.base_url}/admin/autoscale: {exc!r}") from exc

    async def aclose(self) -> None:
        await self.client.aclose()


class ActuatorCounts:
    """The counts of the coordinator's `ScalingControl` in this process."""

    def __init__(self, scaling: Any) -> None:
        self.scaling = scaling  # pdorch.app.scaling.ScalingControl

    async def read(self) -> dict[Pool, PoolStatus]:
        return counts_of(self.scaling.view()["pools"])

    async def aclose(self) -> None:
        return None


class WithPoolCounts(MetricsSource):
    """`inner`'s observation with its `pools` replaced by `counts` (module docstring)."""

    def __init__(self, inner: MetricsSource, counts: PoolCounts) -> None:
        self.inner = inner
        self.counts = counts
        self.name = inner.name

    async def observe(self, now: float) -> Observation:
        obs, pools = await asyncio.gather(self.inner.observe(now), self.counts.read())
        return dataclasses.replace(obs, pools=pools)

    async def aclose(self) -> None:
        await self.inner.aclose()
        await self.counts.aclose()


def loop_source(
    kind: str,
    counts: PoolCounts,
    *,
    url: str,
    admin_token: str | None,
    prometheus_url: str | None = None,
    prometheus_window_s: float = 60.0,
    model: str | None = None,
) -> MetricsSource:
    """The control loop's source: `kind`'s metrics (coordinator at `url`, or Prometheus at
    `prometheus_url` with a `prometheus_window_s` lookback) with `counts`' pool counts.
    `model`: one model of a several-model coordinator (its `?model=` reads; coordinator
    source only)."""
    inner: MetricsSource
    if kind == "prometheus":
        if not prometheus_url:
            raise ValueError("the prometheus metrics source needs a Prometheus URL")
        inner = PrometheusSource(prometheus_url, window_s=prometheus_window_s)
    elif kind == "coordinator":
        inner = CoordinatorSource(url, admin_token=admin_token, model=model)
    else:
        raise ValueError(f"unknown metrics source {kind!r}; known: {', '.join(METRICS_KINDS)}")
    return WithPoolCounts(inner, counts)
