"""`pdorch scale`, `pdorch autoscale` and the scaling admin API against a running coordinator.

The CLI runs in a worker thread (`asyncio.to_thread`) so the coordinator keeps serving on the
test's event loop while the command's synchronous HTTP calls wait on it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from autoscale.policy import parse_policy
from pdorch.app.server import run_coordinator
from pdorch.cli import app
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
