"""`MetricsSource`: where the live control loop reads one `Observation` per tick.

The seam the metrics sources plug into (the coordinator's request metrics, scraped engine
`/metrics`, Prometheus: issue 12 item 4, built separately). Until they land, the loop uses
the **minimal** source here, which knows only what the coordinator already shows:

- pool counts (`ready`/`pending`/`draining`) from `GET /admin/autoscale`;
- per replica: `num_running`, `num_waiting`, `kv_usage` (the coordinator's last scrape of the
  engine), KV capacity, and the coordinator's token load (`prefill_tokens_queued`,
  `decode_blocks` times block size) from `GET /admin/pools` → `ReplicaSignals`;
- `arrival_rps`: the change of `pdorch_requests_total` (answered requests) between two ticks
  over the seconds between them (0 on the first tick).

It reports **no** ISL/OSL, hit rate, TTFT or ITL (zeros / empty summaries), so the planner's
forecast floor is 0 and only its reactive terms (queue, concurrency, KV usage) and the pool
limits act. `observation_from_views` does the mapping for both the HTTP source
(`AdminApiSource`, `pdorch autoscale`) and the in-process one (`CoordinatorSource`).
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from autoscale.signals import Observation, Pool, PoolStatus, ReplicaSignals

_REQUESTS = re.compile(r"^pdorch_requests_total\{[^}]*\}\s+(\S+)", re.MULTILINE)


class MetricsSource(Protocol):
    async def observe(self, now: float) -> Observation: ...


def requests_total(metrics_text: str) -> float:
    """Sum of `pdorch_requests_total` over its labels in a `/metrics` page."""
    return sum(float(v) for v in _REQUESTS.findall(metrics_text))


def observation_from_views(
    pools_view: dict[str, Any],
    autoscale_view: dict[str, Any],
    *,
    now: float,
    window_s: float,
    arrival_rps: float,
) -> Observation:
    block_size = int(pools_view.get("block_size") or 16)
    counts: dict[Pool, PoolStatus] = {}
    replicas: list[ReplicaSignals] = []
    for pool in Pool:
        row = autoscale_view.get("pools", {}).get(pool.value)
        if row is None:
            continue
        counts[pool] = PoolStatus(
            ready=int(row["ready"]), pending=int(row["pending"]), draining=int(row["draining"])
        )
        for r in pools_view.get("pools", {}).get(pool.value, {}).get("replicas", []):
            if r.get("state") != "healthy":
                continue
            load = r.get("load") or {}
            capacity = int(r.get("kv_capacity_blocks") or 0) * block_size
            replicas.append(
                ReplicaSignals(
                    replica_id=str(r["id"]),
                    pool=pool,
                    num_running=int(r.get("num_running") or 0),
                    num_waiting=int(r.get("num_waiting") or 0),
                    queued_prefill_tokens=int(load.get("prefill_tokens_queued") or 0),
                    kv_usage=float(r.get("kv_usage") or 0.0),
                    kv_capacity_tokens=capacity,
                    decode_kv_tokens=int(load.get("decode_blocks") or 0) * block_size,
                )
            )
    return Observation(
        now=now,
        window_s=window_s,
        pools=counts,
        arrival_rps=arrival_rps,
        replicas=tuple(replicas),
    )


class _RateMeter:
    """Requests per second from a cumulative counter's change between two ticks."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def rate(self, now: float, total: float) -> float:
        last, self._last = self._last, (now, total)
        if last is None or now <= last[0]:
            return 0.0
        return max(0.0, total - last[1]) / (now - last[0])


class AdminApiSource:
    """The minimal source over HTTP (module docstring)."""

    def __init__(self, url: str, admin_token: str | None, window_s: float) -> None:
        import httpx

        self.url = url.rstrip("/")
        headers = {"authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.client = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=10.0)
        self.window_s = window_s
        self._rate = _RateMeter()

    async def observe(self, now: float) -> Observation:
        pools = (await self.client.get("/admin/pools")).raise_for_status().json()
        scale = (await self.client.get("/admin/autoscale")).raise_for_status().json()
        metrics = (await self.client.get("/metrics")).raise_for_status().text
        rate = self._rate.rate(now, requests_total(metrics))
        return observation_from_views(
            pools, scale, now=now, window_s=self.window_s, arrival_rps=rate
        )

    async def aclose(self) -> None:
        await self.client.aclose()


class CoordinatorSource:
    """The minimal source in the coordinator's process (`pdorch serve --slo-policy`)."""

    def __init__(self, coordinator: Any, window_s: float) -> None:
        self.c = coordinator
        self.window_s = window_s
        self._rate = _RateMeter()

    async def observe(self, now: float) -> Observation:
        from pdorch.app.admin_scale import autoscale_view

        total = requests_total(self.c.metrics.render().decode())
        return observation_from_views(
            self.c.pools_view(),
            autoscale_view(self.c),
            now=now,
            window_s=self.window_s,
            arrival_rps=self._rate.rate(now, total),
        )
