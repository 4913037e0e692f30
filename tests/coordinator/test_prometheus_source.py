"""Prometheus as the metrics source: a real Prometheus scrapes a simulated P/D fleet behind a
real coordinator (the shipped deploy/prometheus/prometheus.yml, its file_sd written from
/admin/pools), and the planner inputs PromQL gives match the coordinator's own
(`CoordinatorSource`) and the engines' (`EngineScrapeSource`).

Windows are aligned: both reads of the differencing sources happen while the fleet is quiet,
Prometheus has scraped every target after the first read before traffic starts, and the
PromQL window ends at the coordinator's last scrape (`at`). The tolerances:
- request counts and rates: `rate()` extrapolates the window's end by up to one scrape
  interval (counters start at 0 inside it, so its start is not extrapolated): relative
  error ≤ 2 · scrape interval / window, stated for any alignment;
- means (ISL, OSL) and the hit rate: ratios, the extrapolation cancels: 1e-6 relative;
- latency means: 1e-3 relative, plus two samples' share (2 / count): under CI load a sample
  or two can be recorded between the two reads (seen: ITL means 0.16 % apart), and each
  moves a mean by about its share;
- percentiles: within the resolution of the bucket the percentile falls in (the same
  interpolation on the same counts; Prometheus's rate scales every bucket of one target
  alike, so one target gives the same value; several targets can differ by their edges);
- per-replica KV usage while 4 long streams decode: 0.05 absolute (usage grows by about one
  block per step per stream; the two reads are up to one scrape interval apart).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from autoscale.metrics_sources.coordinator import CoordinatorSource, engine_targets
from autoscale.metrics_sources.engines import EngineScrapeSource
from autoscale.metrics_sources.histogram import INF
from autoscale.metrics_sources.prometheus import PrometheusSource
from autoscale.metrics_sources.prometheus_targets import write_file_sd
from autoscale.policy import load_policy
from autoscale.signals import LatencySummary, Observation, Pool
from pdorch.app.metrics import _ITL_BUCKETS, _TTFT_BUCKETS
from pdorch.app.server import run_coordinator
from pdorch.cli import app
from pools.http_client import http_client
from pools.sim.metrics import ITL_BUCKETS as SIM_ITL_BUCKETS
from pools.sim.metrics import TTFT_BUCKETS as SIM_TTFT_BUCKETS
from tests.coordinator.helpers import MODEL, fleet, sim
from tests.data import REPO
from tests.prometheus_server import PrometheusServer
from tests.waiting import async_wait_until

SCRAPE_S = 0.5
WINDOW_S = 10.0
DEPLOY_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"


def scrape_config(coordinator_url: str) -> dict[str, Any]:
    """The shipped config, pointed at this fleet, scraping every SCRAPE_S."""
    config: dict[str, Any] = yaml.safe_load(DEPLOY_CONFIG.read_text())
    config["global"] = {
        "scrape_interval": f"{round(SCRAPE_S * 1000)}ms",
        "scrape_timeout": f"{round(SCRAPE_S * 800)}ms",
        "evaluation_interval": "1s",
    }
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    jobs["pdorch-coordinator"]["static_configs"] = [{"targets": [urlsplit(coordinator_url).netloc]}]
    return config


def bucket_width(value: float | None, bounds: tuple[float, ...]) -> float:
    """Width of the bucket `value` falls in (the resolution of a percentile there)."""
    assert value is not None
    lo = 0.0
    for hi in (*bounds, INF):
        if value <= hi:
            return (hi if hi != INF else bounds[-1]) - lo
        lo = hi
    raise AssertionError(value)


def assert_latency_close(
    got: LatencySummary,
    want: LatencySummary,
    bounds: tuple[float, ...],
    what: str,
    count_rel: float,
) -> None:
    assert want.count > 0, what
    assert got.count == pytest.approx(want.count, rel=count_rel), what
    mean_rel = 1e-3 + 2 / want.count
    assert got.mean_s == pytest.approx(want.mean_s, rel=mean_rel), what
    for q in ("p50_s", "p90_s", "p99_s"):
        a, b = getattr(got, q), getattr(want, q)
        assert abs(a - b) <= bucket_width(b, bounds) + 1e-9, (what, q, a, b)


async def one_request(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> int:
    """A streamed completion; the number of token events it got."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        text = (await response.aread()).decode()
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    return text.count("data: ") - 1


async def traffic(client: httpx.AsyncClient, n: int) -> list[int]:
    """`n` requests, 8 at a time: long prompts (P/D; half share a prefix, so the prefill
    pool hits its cache) and short ones (decoded locally), various output lengths."""
    shared = " ".join(f"shared{i}" for i in range(200))
    limit = asyncio.Semaphore(8)

    async def run(i: int) -> int:
        unique = f"{uuid.uuid4().hex} " + " ".join(f"w{i}x{j}" for j in range(40 + 7 * i))
        prompt = {0: f"{shared} {unique}", 1: unique, 2: f"hi {i}"}[i % 3]
        async with limit:
            return await one_request(client, prompt, 4 + (i * 13) % 60)

    return list(await asyncio.gather(*(run(i) for i in range(n))))


async def prom_scalar(prom: PrometheusSource, expr: str) -> float | None:
    vector = await prom.query(expr)
    return vector[0][1] if vector else None


@pytest.mark.timeout(300)
async def test_prometheus_inputs_match_the_coordinator_and_engines(
    prometheus: Callable[[dict[str, Any]], PrometheusServer],
) -> None:
    config = fleet(
        prefill=[sim(time_scale=0.2)],
        decode=[sim(count=2, time_scale=2.0, num_blocks=512)],
    )
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=120.0) as client,
    ):
        view = (await client.get("/admin/pools")).json()
        server = await asyncio.to_thread(prometheus, scrape_config(pd.url))
        (server.workdir / "targets").mkdir()
        write_file_sd(view, server.workdir / "targets" / "engines.json")
        targets = 1 + len(engine_targets(view))
        assert targets == 4
        wall = time.time
        coord = CoordinatorSource(pd.url)
        engines = EngineScrapeSource(engine_targets(view))
        prom_c = PrometheusSource(server.url, latency="coordinator")
        prom_e = PrometheusSource(server.url, latency="engines")
        try:
            up = "count(up == 1)"
            await async_wait_until(
                lambda: _equals(prom_c, up, targets), 60, 0.2, "every target up in Prometheus"
            )
            w0 = wall()
            await coord.observe(w0)
            await engines.observe(w0)
            # every target scraped after the priming reads: the window starts flat
            after = f"min(timestamp(up)) > {w0:.3f}"
            await async_wait_until(
                lambda: _truthy(prom_c, after), 30, 0.1, "a scrape after the first read"
            )

            tokens = await traffic(client, 36)

            arrivals = "sum(pdorch_request_prompt_tokens_count)"
            await async_wait_until(
                lambda: _equals(prom_c, arrivals, len(tokens)), 30, 0.1, "arrivals scraped"
            )
            done = 'sum(vllm:request_success_total{pool="decode"})'
            await async_wait_until(
                lambda: _equals(prom_c, done, len(tokens)), 30, 0.1, "engine counts scraped"
            )
            # a quiet tail: the window ends flat, at least WINDOW_S long (the rate tolerance
            # is 2 scrape intervals over the window)
            quiet = max(wall(), w0 + WINDOW_S)
            await async_wait_until(
                lambda: _truthy(prom_c, f"min(timestamp(up)) > {quiet:.3f}"),
                WINDOW_S + 30,
                0.1,
                "a scrape of every target after the traffic",
            )
            last = await prom_scalar(prom_c, 'timestamp(up{job="pdorch-coordinator"})')
            assert last is not None
            c = await coord.observe(last)
            e = await engines.observe(last)
            prom_c.window_s = prom_e.window_s = last - w0
            prom_c.at = prom_e.at = lambda: last
            p = await prom_c.observe(last)
            pe = await prom_e.observe(last)
            report(c, e, p, pe)

            # the coordinator counted what the clients got
            assert c.num_requests == len(tokens) == e.num_requests
            assert c.mean_osl_tokens == pytest.approx(sum(tokens) / len(tokens))
            assert e.mean_osl_tokens == pytest.approx(c.mean_osl_tokens)
            assert e.mean_isl_tokens == pytest.approx(c.mean_isl_tokens)  # same tokenizer
            # labels: TTFT by the replica that computed the prompt, ITL by decode replica
            ttft_by = await prom_c.query(
                "sum by (pool, replica) (pdorch_time_to_first_token_seconds_count)"
            )
            itl_by = await prom_c.query(
                "sum by (pool, replica) (pdorch_inter_token_latency_seconds_count)"
            )
            ttft_counts = {(m["pool"], m["replica"]): v for m, v in ttft_by}
            itl_counts = {(m["pool"], m["replica"]): v for m, v in itl_by}
            routes = {m["route"]: v for m, v in await prom_c.query("pdorch_routes_total")}
            assert ttft_counts[("prefill", "prefill-0")] == routes["pd"] > 0
            assert sum(ttft_counts.values()) == len(tokens) == sum(routes.values())
            assert routes["local"] > 0
            assert sum(v for (pool, _), v in itl_counts.items() if pool == "decode") == len(tokens)
            assert itl_counts[("prefill", "prefill-0")] == 0

            rate_tol = 2 * SCRAPE_S / c.window_s
            assert p.arrival_rps == pytest.approx(c.arrival_rps, rel=rate_tol)
            assert p.num_requests == pytest.approx(c.num_requests, rel=rate_tol)
            assert p.mean_isl_tokens == pytest.approx(c.mean_isl_tokens, rel=1e-6)
            assert p.mean_osl_tokens == pytest.approx(c.mean_osl_tokens, rel=1e-6)
            assert p.prefix_hit_rate == pytest.approx(c.prefix_hit_rate, rel=1e-6)
            assert c.prefix_hit_rate > 0.1  # the shared prefix hit the prefill cache
            assert_latency_close(p.ttft, c.ttft, _TTFT_BUCKETS, "TTFT coordinator", rate_tol)
            assert_latency_close(p.itl, c.itl, _ITL_BUCKETS, "ITL coordinator", rate_tol)
            assert_latency_close(pe.ttft, e.ttft, SIM_TTFT_BUCKETS, "TTFT engines", rate_tol)
            assert_latency_close(pe.itl, e.itl, SIM_ITL_BUCKETS, "ITL engines", rate_tol)
            assert p.pools[Pool.PREFILL].ready == c.pools[Pool.PREFILL].ready == 1
            assert p.pools[Pool.DECODE].ready == c.pools[Pool.DECODE].ready == 2

            await check_kv_usage(client, coord, engines, prom_c)
        finally:
            for source in (coord, engines, prom_c, prom_e):
                await source.aclose()


async def check_kv_usage(
    client: httpx.AsyncClient,
    coord: CoordinatorSource,
    engines: EngineScrapeSource,
    prom: PrometheusSource,
) -> None:
    """Per-replica KV usage and running requests agree while long streams decode; the
    coordinator's source adds its token load to the same replicas."""
    prom.at = None
    prompt = " ".join(f"hold{i}" for i in range(100))
    holds = [
        asyncio.ensure_future(one_request(client, f"{uuid.uuid4().hex} {prompt}", 2000))
        for _ in range(4)
    ]
    try:

        async def busy() -> Observation | None:
            obs = await engines.observe(time.time())
            decode = obs.replicas_of(Pool.DECODE)
            running = sum(r.num_running for r in decode)
            return obs if running == 4 and all(r.kv_usage > 0.05 for r in decode) else None

        await async_wait_until(busy, 60, 0.1, "4 streams decoding on both decode replicas")
        running = 'sum(vllm:num_requests_running{pool="decode"})'
        await async_wait_until(
            lambda: _equals(prom, running, 4), 30, 0.1, "Prometheus sees the 4 streams"
        )
        e = await engines.observe(time.time())
        p = await prom.observe(time.time())
        got = {r.replica_id: r for r in p.replicas}
        co = await coord.observe(time.time())
        decoding = co.replicas_of(Pool.DECODE)
        assert sum(r.num_running for r in decoding) == 4
        assert all(r.decode_kv_tokens > 0 for r in decoding), decoding
        for r in e.replicas_of(Pool.DECODE):
            assert r.replica_id in got, (r.replica_id, sorted(got))
            assert got[r.replica_id].kv_usage == pytest.approx(r.kv_usage, abs=0.05)
            assert got[r.replica_id].num_running == r.num_running
        print(
            "kv usage (scrape vs prometheus):",
            [
                (r.replica_id, round(r.kv_usage, 4), round(got[r.replica_id].kv_usage, 4))
                for r in e.replicas
            ],
        )
    finally:
        for hold in holds:
            hold.cancel()
        await asyncio.gather(*holds, return_exceptions=True)


async def _equals(prom: PrometheusSource, expr: str, want: float) -> bool:
    value = await prom_scalar(prom, expr)
    return value is not None and value == want


async def _truthy(prom: PrometheusSource, expr: str) -> bool:
    return bool(await prom.query(expr))


def report(c: Observation, e: Observation, p: Observation, pe: Observation) -> None:
    """The compared inputs, for the log (pytest -s)."""

    def row(name: str, o: Observation) -> str:
        return (
            f"{name:12} window={o.window_s:.2f}s n={o.num_requests} rps={o.arrival_rps:.3f} "
            f"isl={o.mean_isl_tokens:.1f} osl={o.mean_osl_tokens:.2f} hit={o.prefix_hit_rate:.4f} "
            f"ttft p50/p90/p99/mean={o.ttft.p50_s}/{o.ttft.p90_s}/{o.ttft.p99_s}/{o.ttft.mean_s} "
            f"(n={o.ttft.count}) itl p90/mean={o.itl.p90_s}/{o.itl.mean_s} (n={o.itl.count})"
        )

    for name, o in (("coordinator", c), ("prom/coord", p), ("engines", e), ("prom/engines", pe)):
        print(row(name, o))


@pytest.mark.timeout(180)
async def test_autoscale_cli_plans_from_prometheus(
    prometheus: Callable[[dict[str, Any]], PrometheusServer], tmp_path: Path
) -> None:
    """`pdorch autoscale --metrics prometheus --once`: the planner's load comes from PromQL
    (what the coordinator counted), the pool counts from the coordinator's actuator."""
    policy = tmp_path / "slo.yaml"
    policy.write_text(json.dumps({"pools": {"prefill": {"max": 2}, "decode": {"max": 2}}}))
    config = fleet(prefill=[sim(time_scale=0.2)], decode=[sim(time_scale=0.2)])
    async with (
        run_coordinator(config, slo_policy=load_policy(policy)) as pd,
        http_client(base_url=pd.url, timeout=120.0) as client,
    ):
        view = (await client.get("/admin/pools")).json()
        server = await asyncio.to_thread(prometheus, scrape_config(pd.url))
        (server.workdir / "targets").mkdir()
        write_file_sd(view, server.workdir / "targets" / "engines.json")
        prom = PrometheusSource(server.url)
        try:
            await async_wait_until(
                lambda: _equals(prom, "count(up == 1)", 3), 60, 0.2, "every target up"
            )
            tokens = await traffic(client, 12)
            arrivals = "sum(pdorch_request_prompt_tokens_count)"
            await async_wait_until(
                lambda: _equals(prom, arrivals, len(tokens)), 30, 0.1, "arrivals scraped"
            )
        finally:
            await prom.aclose()
        args = ["autoscale", "--policy", str(policy), "--url", pd.url, "--once"]
        args += ["--metrics", "prometheus", "--prometheus-url", server.url]
        args += ["--prometheus-window-s", "30"]
        result = await asyncio.to_thread(CliRunner().invoke, app, args)
        assert result.exit_code == 0, result.output
        scale = (await client.get("/admin/autoscale")).json()
        decisions = {d["pool"]: d for d in scale["decisions"]}
        assert set(decisions) == {"prefill", "decode"} and scale["autoscaler"] == "remote"
        inputs = decisions["prefill"]["inputs"]
        assert inputs["arrival_rps"] > 0  # PromQL's rate over the window saw the requests
        assert inputs["details"]["prefill"]["floor_inputs"]["isl"] > 0
        assert inputs["pools"]["prefill"] == {"ready": 1, "pending": 0, "draining": 0}
        assert inputs["observed"]["ttft_p90_s"] is not None
