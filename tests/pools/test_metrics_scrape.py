"""`/metrics` parsing against real vLLM captures, and the scraper against a real sim engine."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from pools.fleet import Fleet, FleetEvent, ReplicaMetricsUpdated
from pools.http_client import http_client
from pools.metrics_scrape import MetricsScraper, parse_vllm_metrics
from pools.replica import ReplicaEndpoint
from pools.sim.server import SimServer
from pools.sim.settings import SimEngineSettings
from tests.data import VLLM_FIXTURES
from tests.waiting import async_wait_until

FIXTURES = VLLM_FIXTURES


def test_real_vllm_capture_single() -> None:
    m = parse_vllm_metrics((FIXTURES / "metrics_single.txt").read_text(), now=5.0)
    assert (m.num_running, m.num_waiting, m.kv_usage) == (0, 0, 0.0)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (313.0, 128.0)
    assert m.prefix_hit_rate == pytest.approx(128 / 313)
    assert (m.num_gpu_blocks, m.block_size) == (16384, 32)
    assert m.scraped_at == 5.0


def test_real_vllm_capture_decode_after_pd() -> None:
    m = parse_vllm_metrics((FIXTURES / "metrics_decode_after.txt").read_text(), now=0.0)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (1516.0, 0.0)
    assert m.prefix_hit_rate == 0.0
    assert m.num_gpu_blocks == 16384


def test_busy_page_sums_engines_and_averages_kv_usage() -> None:
    text = (FIXTURES / "metrics_single.txt").read_text()
    for name, engine0, engine1 in (
        ("vllm:num_requests_running", "3.0", "2.0"),
        ("vllm:num_requests_waiting", "1.0", "4.0"),
        ("vllm:kv_cache_usage_perc", "0.5", "0.25"),
    ):
        text = text.replace(
            f'{name}{{engine="0",model_name="tiny"}} 0.0',
            "\n".join(
                [
                    f'{name}{{engine="0",model_name="tiny"}} {engine0}',
                    f'{name}{{engine="1",model_name="tiny"}} {engine1}',
                ]
            ),
        )
    m = parse_vllm_metrics(text, now=0.0)
    assert (m.num_running, m.num_waiting) == (5, 5)
    assert m.kv_usage == pytest.approx(0.375)


def test_missing_metrics_read_zero_and_none() -> None:
    m = parse_vllm_metrics("# nothing here\nother_metric 1.0\n", now=0.0)
    assert (m.num_running, m.num_waiting, m.kv_usage, m.num_gpu_blocks) == (0, 0, 0.0, None)
    assert m.prefix_hit_rate is None


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    server = SimServer(
        SimEngineSettings.model_validate(
            {
                "port": 0,
                "time_scale": 0.01,
                "block_size": 16,
                "num_blocks": 256,
                "max_model_len": 2048,
                "served_model_name": "m",
                "kv_transport": "none",
            }
        )
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.mark.integration
async def test_scraper_feeds_the_fleet_from_a_sim_engine(sim: SimServer) -> None:
    assert sim.url is not None
    fleet = Fleet()
    updates: list[ReplicaMetricsUpdated] = []

    def on_event(event: FleetEvent) -> None:
        if isinstance(event, ReplicaMetricsUpdated):
            updates.append(event)

    fleet.subscribe(on_event)
    fleet.add_replica(ReplicaEndpoint("decode-0", "decode", sim.url, "m", 16), 0.0)
    fleet.add_replica(ReplicaEndpoint("gone", "decode", "http://127.0.0.1:9", "m", 16), 0.0)
    async with http_client() as client:
        scraper = MetricsScraper(fleet, client, interval_s=0.05, timeout_s=1.0)
        assert await scraper.scrape_once() == 1  # the dead one is skipped, not fatal
        assert scraper.failures == 1
        body = {"model": "m", "prompt": "hello " * 64, "max_tokens": 4}
        assert (await client.post(f"{sim.url}/v1/completions", json=body)).status_code == 200
        assert (await client.post(f"{sim.url}/v1/completions", json=body)).status_code == 200
        async with scraper:

            async def hits() -> bool:
                replica = fleet.get("decode-0")
                m = replica.metrics if replica is not None else None
                return m is not None and m.prefix_cache_hits > 0

            await async_wait_until(hits, timeout=5.0, message="prefix hits in the scrape")
    replica = fleet.get("decode-0")
    assert replica is not None and replica.metrics is not None
    assert replica.metrics.prefix_cache_queries >= replica.metrics.prefix_cache_hits > 0
    assert updates and updates[-1].replica.replica_id == "decode-0"


@pytest.mark.integration
async def test_scraper_on_an_aiohttp_session(sim: SimServer) -> None:
    """The coordinator scrapes on its legs' aiohttp session: same snapshot, same skipping."""
    assert sim.url is not None
    fleet = Fleet()
    fleet.add_replica(ReplicaEndpoint("decode-0", "decode", sim.url, "m", 16), 0.0)
    fleet.add_replica(ReplicaEndpoint("gone", "decode", "http://127.0.0.1:9", "m", 16), 0.0)
    body = {"model": "m", "prompt": "hello " * 64, "max_tokens": 4}
    async with http_client() as client:
        for _ in range(2):
            assert (await client.post(f"{sim.url}/v1/completions", json=body)).status_code == 200
    async with aiohttp.ClientSession() as session:
        scraper = MetricsScraper(fleet, session, interval_s=0.05, timeout_s=1.0)
        assert await scraper.scrape_once() == 1  # the dead one is skipped, not fatal
        assert scraper.failures == 1
    replica = fleet.get("decode-0")
    assert replica is not None and replica.metrics is not None
    assert replica.metrics.prefix_cache_queries >= replica.metrics.prefix_cache_hits > 0
