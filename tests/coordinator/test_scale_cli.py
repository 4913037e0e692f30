"""`pdorch scale`, `pdorch autoscale` and the scaling admin API against a running coordinator.

The CLI runs in a worker thread (`asyncio.to_thread`) so the coordinator keeps serving on the
test's event loop while the command's synchronous HTTP calls wait on it.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner, Result

from autoscale.policy import parse_policy
from pdorch.app.admin_scale import observed_view
from pdorch.app.metrics import _TTFT_BUCKETS as TTFT_BUCKETS
from pdorch.app.server import run_coordinator
from pdorch.cli import app
from pdorch.cli.scale import seconds_text
from pools.http_client import http_client
from tests.coordinator.helpers import MODEL, assert_openai_error, fleet, long_prompt, sim

POLICY = {
    "pools": {
        "prefill": {"min": 1, "max": 2},
        "decode": {"min": 1, "max": 3, "drain_timeout_s": 30},
    },
    "gpu_budget": 3,
}

# `--once` reads twice (the first read starts the window): half a second apart, not 5 s
FAST = ("--interval-s", "0.5")


async def _cli(*args: str) -> Result:
    runner = CliRunner(env={"COLUMNS": "200"})  # wide enough for the status table
    return await asyncio.to_thread(runner.invoke, app, list(args))


def _demo_like() -> Any:
    return run_coordinator(
        fleet(prefill=[sim(1)], decode=[sim(1, switchable=True)]),
        slo_policy=parse_policy(POLICY),
    )


async def test_scale_status_set_auto_and_errors_through_the_cli() -> None:
    async with _demo_like() as pd:
        url = pd.url
        result = await _cli("scale", "status", "--url", url, "--json")
        assert result.exit_code == 0, result.output
        view = json.loads(result.stdout)
        decode = view["pools"]["decode"]
        assert (decode["ready"], decode["pending"], decode["draining"]) == (1, 0, 0)
        assert view["pools"]["prefill"]["ready"] == 1
        assert view["decisions"] == [] and view["autoscaler"] is None

        result = await _cli("scale", "set", "decode", "+1", "--url", url, "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == {
            "pool": "decode",
            "replicas": 2,
            "applied": True,
            "pinned": True,
            "reason": "manual",
        }
        assert pd.coordinator.scaling is not None
        await pd.coordinator.scaling.actuator.idle(60)
        view = json.loads((await _cli("scale", "status", "--url", url, "--json")).stdout)
        assert (view["pools"]["decode"]["ready"], view["pools"]["decode"]["pinned"]) == (2, 2)

        table = await _cli("scale", "status", "--url", url)
        assert table.exit_code == 0 and "decode" in table.stdout and "prefill" in table.stdout

        # bad input: each error names the problem
        for args, words in (
            (("scale", "set", "gpu", "2"), ("404", "Unknown pool", "gpu")),
            (("scale", "set", "decode", "0"), ("400", "below its min of 1")),
            (("scale", "set", "decode", "4"), ("400", "above its max of 3")),
            (("scale", "set", "prefill", "2"), ("400", "gpu_budget of 3")),
            (("scale", "set", "decode", "two"), ("not N, +N or -N",)),
        ):
            result = await _cli(*args, "--url", url)
            assert result.exit_code != 0, args
            for word in words:
                assert word in result.stderr, (args, result.stderr)

        result = await _cli("scale", "auto", "decode", "--url", url, "--json")
        assert result.exit_code == 0 and json.loads(result.stdout)["was_pinned_at"] == 2
        result = await _cli("scale", "set", "decode", "-1", "--url", url)
        assert result.exit_code == 0, result.output
        await pd.coordinator.scaling.actuator.idle(60)
        assert pd.coordinator.scaling.actuator.status("decode").ready == 1


async def test_admin_scale_api_errors_are_openai_shaped() -> None:
    async with _demo_like() as pd, http_client(base_url=pd.url, timeout=30) as client:
        error = assert_openai_error(
            await client.post("/admin/pools/nope/scale", json={"replicas": 1}), 404
        )
        assert "nope" in error["message"]
        error = assert_openai_error(
            await client.post("/admin/pools/decode/scale", json={"replicas": 9}), 400
        )
        assert "max of 3" in error["message"]
        error = assert_openai_error(await client.post("/admin/pools/decode/scale", json={}), 400)
        assert "replicas" in error["message"]
        error = assert_openai_error(
            await client.post("/admin/replicas/prefill-0/move", json={"to": "decode"}), 400
        )
        assert "switchable" in error["message"]
        metrics = (await client.get("/metrics")).text
        assert 'pdorch_pool_replicas{pool="decode",state="ready"} 1.0' in metrics


async def test_scale_move_switches_a_replica_and_serves_in_its_new_pool() -> None:
    async with _demo_like() as pd, http_client(base_url=pd.url, timeout=30) as client:
        # one more decode replica first (min 1), then move the original one to prefill
        await _cli("scale", "set", "decode", "2", "--url", pd.url)
        assert pd.coordinator.scaling is not None
        await pd.coordinator.scaling.actuator.idle(60)
        result = await _cli("scale", "move", "decode-0", "--to", "prefill", "--url", pd.url)
        assert result.exit_code == 0, result.output
        await pd.coordinator.scaling.actuator.idle(60)
        replica = pd.coordinator.fleet.get("decode-0")
        assert replica is not None and replica.pool == "prefill" and replica.routable
        body = {"model": MODEL, "prompt": long_prompt(), "max_tokens": 4}
        assert (await client.post("/v1/completions", json=body)).status_code == 200
        metrics = (await client.get("/metrics")).text
        assert 'pdorch_role_switches_total{from_pool="decode",to_pool="prefill"} 1.0' in metrics


async def test_autoscale_once_records_its_decision_and_respects_a_pin(tmp_path: Path) -> None:
    policy = tmp_path / "slo.yaml"
    policy.write_text(json.dumps(POLICY))  # JSON is YAML
    async with _demo_like() as pd:
        result = await _cli("autoscale", "--policy", str(policy), "--url", pd.url, "--once", *FAST)
        assert result.exit_code == 0, result.output
        view = json.loads((await _cli("scale", "status", "--url", pd.url, "--json")).stdout)
        pools = {d["pool"] for d in view["decisions"]}
        assert pools == {"prefill", "decode"}
        assert all(d["reason"] and "inputs" in d for d in view["decisions"])
        assert view["autoscaler"] == "remote"
        async with http_client(base_url=pd.url) as client:
            metrics = (await client.get("/metrics")).text
        assert "pdorch_autoscale_decisions_total{pool=" in metrics
        # pinned pools are left alone, and the decision says so
        await _cli("scale", "set", "decode", "1", "--url", pd.url)
        result = await _cli("autoscale", "--policy", str(policy), "--url", pd.url, "--once", *FAST)
        assert result.exit_code == 0, result.output
        view = json.loads((await _cli("scale", "status", "--url", pd.url, "--json")).stdout)
        assert view["pools"]["decode"]["last_decision"]["reason"] == "pinned"
        # dry-run changes nothing and records nothing
        before = len(view["decisions"])
        result = await _cli(
            "autoscale", "--policy", str(policy), "--url", pd.url, "--once", "--dry-run", *FAST
        )
        assert result.exit_code == 0 and "dry-run: pool" in result.stdout
        view = json.loads((await _cli("scale", "status", "--url", pd.url, "--json")).stdout)
        assert len(view["decisions"]) == before


async def _timed_stream(client: httpx.AsyncClient) -> float:
    """One streamed P/D request; seconds from sending it to its first byte."""
    body = {"model": MODEL, "prompt": long_prompt(), "max_tokens": 6, "stream": True}
    began = time.monotonic()
    first: float | None = None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["x-pdorch-route"] == "pd"
        async for _ in response.aiter_bytes():
            first = first or time.monotonic() - began
    assert first is not None
    return first


async def test_scale_status_shows_the_coordinators_own_p90s_against_the_slo(
    tmp_path: Path,
) -> None:
    async with _demo_like() as pd, http_client(base_url=pd.url, timeout=30) as client:
        view = json.loads((await _cli("scale", "status", "--url", pd.url, "--json")).stdout)
        prefill = view["pools"]["prefill"]["observed"]
        assert prefill["source"] == "coordinator" and prefill["window_s"] == 60
        assert (prefill["ttft_p90_s"], prefill["ttft_samples"], prefill["ttft_slo_s"]) == (
            None, 0, 2.0
        )  # fmt: skip

        ttfts = [await _timed_stream(client) for _ in range(10)]
        view = json.loads((await _cli("scale", "status", "--url", pd.url, "--json")).stdout)
        prefill = view["pools"]["prefill"]["observed"]
        decode = view["pools"]["decode"]["observed"]
        assert view["autoscaler"] is None  # nobody reports: the coordinator's own window
        assert prefill["source"] == decode["source"] == "coordinator"
        assert prefill["ttft_samples"] == 10 and prefill["ttft_slo_percentile"] == 99
        # the coordinator's p90 is within one TTFT bucket of what the client saw
        lowest = max([0.0, *(b for b in TTFT_BUCKETS if b < min(ttfts))])
        highest = min(b for b in TTFT_BUCKETS if b >= max(ttfts))
        assert lowest <= prefill["ttft_p90_s"] <= highest, (prefill, ttfts)
        # each pool shows the metric it is sized on: prefill TTFT, decode ITL
        assert prefill["itl_p90_s"] is prefill["itl_samples"] is prefill["itl_slo_s"] is None
        assert decode["ttft_p90_s"] is decode["ttft_samples"] is decode["ttft_slo_s"] is None
        assert decode["itl_samples"] == 10 and 0 < decode["itl_p90_s"] < max(ttfts)
        assert decode["itl_slo_s"] == 0.05

        table = await _cli("scale", "status", "--url", pd.url)
        assert table.exit_code == 0, table.output
        ttft, itl = seconds_text(prefill["ttft_p90_s"]), seconds_text(decode["itl_p90_s"])
        assert f"TTFT {ttft} / 2.00s" in table.stdout, table.stdout
        assert f"ITL {itl} / 50.0ms" in table.stdout, table.stdout
        assert "coordinator's own requests, 60 s window" in table.stdout

        # once an autoscaler reports, its observation is shown (with its window)
        policy = tmp_path / "slo.yaml"
        policy.write_text(json.dumps(POLICY))
        result = await _cli("autoscale", "--policy", str(policy), "--url", pd.url, "--once", *FAST)
        assert result.exit_code == 0, result.output
        view = json.loads((await _cli("scale", "status", "--url", pd.url, "--json")).stdout)
        prefill = view["pools"]["prefill"]["observed"]
        assert prefill["source"] == "autoscaler" and 0 < prefill["window_s"] < 60
        assert prefill["ttft_slo_s"] == 2.0 and prefill["itl_p90_s"] is None
        # a report more than a minute old is stale: the coordinator's own window again
        scaling = pd.coordinator.scaling
        later = observed_view(pd.coordinator, scaling, "prefill", time.monotonic() + 61)
        assert later["source"] == "coordinator" and later["ttft_samples"] == 10


async def test_cli_says_when_no_coordinator_answers() -> None:
    result = await _cli("scale", "status", "--url", "http://127.0.0.1:9", "--json")
    assert result.exit_code == 2 and "cannot reach the coordinator" in result.stderr


async def test_autoscale_metrics_option_errors_name_the_option(tmp_path: Path) -> None:
    policy = tmp_path / "slo.yaml"
    policy.write_text(json.dumps(POLICY))
    result = await _cli("autoscale", "--policy", str(policy), "--metrics", "prometheus")
    assert result.exit_code == 2 and "--prometheus-url" in result.stderr, result.output
    result = await _cli("autoscale", "--policy", str(policy), "--metrics", "minimal")
    assert result.exit_code == 2 and "unknown --metrics 'minimal'" in result.stderr
