"""`PrometheusSource`: PromQL over Prometheus's HTTP API (`/api/v1/query`) → an `Observation`.

The way the Dynamo planner reads its inputs: Prometheus scrapes the coordinator and every
engine (`deploy/prometheus/prometheus.yml` gives every engine target `pool` and `replica`
labels), and each tick runs instant queries over a fixed lookback `W = window_s`:

- TTFT p50/p90/p99: `histogram_quantile(q, sum by (le) (rate(<ttft>_bucket{M}[W])))`;
  mean `sum(rate(<ttft>_sum{M}[W])) / sum(rate(<ttft>_count{M}[W]))`; count
  `sum(increase(<ttft>_count{M}[W]))` (`M`: the optional extra `matchers`); ITL the same;
- arrivals: `sum(rate(pdorch_request_prompt_tokens_count{M}[W]))` (rps) and `increase` (count);
- mean ISL / OSL: `sum(rate(<h>_sum{M}[W])) / sum(rate(<h>_count{M}[W]))` of
  `pdorch_request_prompt_tokens` / `pdorch_request_generation_tokens`;
- prefix hit rate: `sum(rate(vllm:prefix_cache_hits_total{pool="prefill",M}[W]))` over the
  same of `vllm:prefix_cache_queries_total`;
- per replica: `avg by (pool, replica) (vllm:kv_cache_usage_perc{M})`, `sum by (pool,
  replica)` of `vllm:num_requests_running` and `vllm:num_requests_waiting`;
- pools: `sum by (pool, state) (pdorch_pool_replicas{M})` when the coordinator exports it,
  else `count by (pool) (up{pool=~"prefill|decode",M} == 1)` as `ready`.

`latency="coordinator"` (default) takes TTFT / ITL from pdorch's histograms
(`pdorch_time_to_first_token_seconds`, `pdorch_inter_token_latency_seconds`: what clients
saw); `latency="engines"` from vLLM's (`vllm:time_to_first_token_seconds{pool="prefill"}`,
`vllm:inter_token_latency_seconds{pool="decode"}`, as `EngineScrapeSource` reads them).

Window: a fixed lookback, every call is the last `window_s` seconds at the query's time
(`at()`, a wall-clock function; None: Prometheus's own now). `rate`/`increase` extrapolate
to the window's edges from the samples inside it, so counts and rates carry an error up to
about two scrape intervals over `window_s`; ratios (means, hit rate) and percentiles do not
(the extrapolation factor cancels). Percentiles use Prometheus's `histogram_quantile`, the
same rule as `histogram.CumulativeHistogram.quantile`. A query that has no data (NaN, empty)
reads as None / 0.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

import httpx

from autoscale.metrics_sources.base import SCRAPE_TIMEOUT_S, MetricsSource, MetricsSourceError
from autoscale.metrics_sources.window import pool_of
from autoscale.signals import LatencySummary, Observation, Pool, PoolStatus, ReplicaSignals
from pools.http_client import http_client

Latency = Literal["coordinator", "engines"]
_HISTOGRAMS: dict[Latency, tuple[tuple[str, str], tuple[str, str]]] = {
    "coordinator": (
        ("pdorch_time_to_first_token_seconds", ""),
        ("pdorch_inter_token_latency_seconds", ""),
    ),
    "engines": (
        ("vllm:time_to_first_token_seconds", 'pool="prefill"'),
        ("vllm:inter_token_latency_seconds", 'pool="decode"'),
    ),
}
_QUANTILES = (0.5, 0.9, 0.99)

Vector = list[tuple[dict[str, str], float]]


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _selector(name: str, *matchers: str) -> str:
    inside = ",".join(m for m in matchers if m)
    return f"{name}{{{inside}}}" if inside else name


def _scalar(vector: Vector) -> float | None:
    """The one value of an aggregated query (None when empty or NaN)."""
    if not vector:
        return None
    value = vector[0][1]
    return None if math.isnan(value) or math.isinf(value) else value


class PrometheusSource(MetricsSource):
    """Queries one Prometheus server (see the module docstring)."""

    name = "prometheus"

    def __init__(
        self,
        url: str,
        *,
        window_s: float = 60.0,
        latency: Latency = "coordinator",
        matchers: str = "",
        at: Callable[[], float] | None = None,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = SCRAPE_TIMEOUT_S,
    ) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.url = url.rstrip("/")
        self.window_s = window_s
        self.latency = latency
        self.matchers = matchers
        self.at = at
        self._own_client = client is None
        self.client = client or http_client(timeout=timeout_s)
        self.timeout_s = timeout_s

    # ---- the queries -------------------------------------------------------------------------

    def queries(self) -> dict[str, str]:
        """Every PromQL expression of one observation, by name."""
        w, m = _duration(self.window_s), self.matchers
        out: dict[str, str] = {}
        (ttft, ttft_m), (itl, itl_m) = _HISTOGRAMS[self.latency]
        for key, name, extra in (("ttft", ttft, ttft_m), ("itl", itl, itl_m)):
            bucket = _selector(name + "_bucket", extra, m)
            for q in _QUANTILES:
                out[f"{key}_p{round(q * 100)}"] = (
                    f"histogram_quantile({q}, sum by (le) (rate({bucket}[{w}])))"
                )
            total_sum = f"sum(rate({_selector(name + '_sum', extra, m)}[{w}]))"
            count = _selector(name + "_count", extra, m)
            out[f"{key}_mean"] = f"{total_sum} / sum(rate({count}[{w}]))"
            out[f"{key}_count"] = f"sum(increase({count}[{w}]))"
        for key, name in (
            ("isl", "pdorch_request_prompt_tokens"),
            ("osl", "pdorch_request_generation_tokens"),
        ):
            count = f"sum(rate({_selector(name + '_count', m)}[{w}]))"
            out[f"{key}_mean"] = f"sum(rate({_selector(name + '_sum', m)}[{w}])) / {count}"
        arrivals = _selector("pdorch_request_prompt_tokens_count", m)
        out["arrival_rps"] = f"sum(rate({arrivals}[{w}]))"
        out["arrivals"] = f"sum(increase({arrivals}[{w}]))"
        hits = _selector("vllm:prefix_cache_hits_total", 'pool="prefill"', m)
        queries = _selector("vllm:prefix_cache_queries_total", 'pool="prefill"', m)
        out["hit_rate"] = f"sum(rate({hits}[{w}])) / sum(rate({queries}[{w}]))"
        by = "(pool, replica)"
        out["kv_usage"] = f"avg by {by} ({_selector('vllm:kv_cache_usage_perc', m)})"
        out["running"] = f"sum by {by} ({_selector('vllm:num_requests_running', m)})"
        out["waiting"] = f"sum by {by} ({_selector('vllm:num_requests_waiting', m)})"
        out["pool_replicas"] = f"sum by (pool, state) ({_selector('pdorch_pool_replicas', m)})"
        up = _selector("up", 'pool=~"prefill|decode"', m)
        out["engines_up"] = f"count by (pool) ({up} == 1)"
        return out

    async def query(self, expr: str, at: float | None = None) -> Vector:
        """One instant query; the vector's (labels, value) pairs."""
        params: dict[str, str] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        try:
            response = await self.client.get(
                self.url + "/api/v1/query", params=params, timeout=self.timeout_s
            )
            body: Any = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise MetricsSourceError(f"{self.url}: query {expr!r}: {exc!r}") from exc
        if response.status_code != 200 or body.get("status") != "success":
            raise MetricsSourceError(
                f"{self.url}: query {expr!r}: {body.get('error', response.status_code)}"
            )
        data = body["data"]
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        return [(dict(r["metric"]), float(r["value"][1])) for r in data["result"]]

    # ---- the observation ---------------------------------------------------------------------

    async def observe(self, now: float) -> Observation:
        at = self.at() if self.at is not None else None
        exprs = self.queries()
        answers = await asyncio.gather(*(self.query(e, at) for e in exprs.values()))
        return prometheus_observation(now, self.window_s, dict(zip(exprs, answers, strict=True)))

    async def aclose(self) -> None:
        if self._own_client:
            await self.client.aclose()


def _latency(results: Mapping[str, Vector], key: str) -> LatencySummary:
    count = _scalar(results[f"{key}_count"]) or 0.0
    if count <= 0:
        return LatencySummary()
    return LatencySummary(
        count=round(count),
        p50_s=_scalar(results[f"{key}_p50"]),
        p90_s=_scalar(results[f"{key}_p90"]),
        p99_s=_scalar(results[f"{key}_p99"]),
        mean_s=_scalar(results[f"{key}_mean"]),
    )


def _pools(results: Mapping[str, Vector]) -> dict[Pool, PoolStatus]:
    counts: dict[Pool, dict[str, int]] = {}
    for labels, value in results["pool_replicas"]:
        pool = pool_of(labels.get("pool", ""))
        if pool is not None:
            counts.setdefault(pool, {})[labels.get("state", "")] = round(value)
    if counts:
        return {
            p: PoolStatus(c.get("ready", 0), c.get("pending", 0), c.get("draining", 0))
            for p, c in counts.items()
        }
    out: dict[Pool, PoolStatus] = {}
    for labels, value in results["engines_up"]:
        pool = pool_of(labels.get("pool", ""))
        if pool is not None:
            out[pool] = PoolStatus(ready=round(value))
    return out


def _replicas(results: Mapping[str, Vector]) -> tuple[ReplicaSignals, ...]:
    per: dict[tuple[str, str], dict[str, float]] = {}
    for key in ("kv_usage", "running", "waiting"):
        for labels, value in results[key]:
            ident = (labels.get("pool", ""), labels.get("replica", ""))
            per.setdefault(ident, {})[key] = value
    out = []
    for (pool_name, replica_id), v in sorted(per.items()):
        pool = pool_of(pool_name)
        if pool is None or not replica_id:
            continue
        out.append(
            ReplicaSignals(
                replica_id=replica_id,
                pool=pool,
                num_running=round(v.get("running", 0.0)),
                num_waiting=round(v.get("waiting", 0.0)),
                kv_usage=min(1.0, max(0.0, v.get("kv_usage", 0.0))),
            )
        )
    return tuple(out)


def prometheus_observation(
    now: float, window_s: float, results: Mapping[str, Vector]
) -> Observation:
    """The pure reduction of the query answers (keys of `PrometheusSource.queries`)."""
    return Observation(
        now=now,
        window_s=window_s,
        pools=_pools(results),
        num_requests=round(_scalar(results["arrivals"]) or 0.0),
        arrival_rps=_scalar(results["arrival_rps"]) or 0.0,
        mean_isl_tokens=_scalar(results["isl_mean"]) or 0.0,
        mean_osl_tokens=_scalar(results["osl_mean"]) or 0.0,
        prefix_hit_rate=_scalar(results["hit_rate"]) or 0.0,
        ttft=_latency(results, "ttft"),
        itl=_latency(results, "itl"),
        replicas=_replicas(results),
    )
