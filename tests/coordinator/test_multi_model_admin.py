"""`/admin/*`, `/metrics` and `pdorch scale` of a several-model fleet: `?model=`
(`--served-model-name`) picks the model, the first is the default, an unknown name is a 404
naming the served ones."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from pdorch.app.scaling import ScalingControl
from pdorch.app.server import RunningCoordinator, run_coordinator
from pdorch.cli import app
from pdorch.config.fleet import parse_fleet_config
from pools.http_client import http_client
from tests.coordinator.helpers import assert_openai_error, long_prompt, sim

FIRST = "chat-8b"
SECOND = "code-3b"


async def _cli(*args: str) -> Result:
    runner = CliRunner(env={"COLUMNS": "200"})
    return await asyncio.to_thread(runner.invoke, app, list(args))


@pytest.fixture
async def two_models(tmp_path: Path) -> AsyncIterator[RunningCoordinator]:
    """Two P/D models of 1 prefill + 1 decode; the second's SLO policy lets decode reach 3."""
    policy = tmp_path / "code-policy.yaml"
    policy.write_text(json.dumps({"pools": {"decode": {"min": 1, "max": 3}}}))
    pools = {"prefill": {"launch": [sim()]}, "decode": {"launch": [sim()]}}
    config = parse_fleet_config(
        {
            "models": [
                {"served_model_name": FIRST, "pools": pools, "pd": {"min_uncached_tokens": 32}},
                {
                    "served_model_name": SECOND,
                    "pools": pools,
                    "pd": {"min_uncached_tokens": 32},
                    "slo_policy": str(policy),
                },
            ],
            "coordinator": {"port": 0},
        }
    )
    async with run_coordinator(config) as running:
        yield running


def _decode(running: RunningCoordinator, model: str) -> int:
    scaling = running.models[model][0].scaling
    assert isinstance(scaling, ScalingControl)
    return scaling.actuator.status("decode").provisioned


async def test_admin_routes_take_a_model_and_default_to_the_first(
    two_models: RunningCoordinator,
) -> None:
    first, _ = two_models.models[FIRST]
    second, _ = two_models.models[SECOND]
    async with http_client(base_url=two_models.url, timeout=30.0) as client:
        default = (await client.get("/admin/autoscale")).json()
        named = (await client.get("/admin/autoscale", params={"model": FIRST})).json()
        other = (await client.get("/admin/autoscale", params={"model": SECOND})).json()
        assert default["pools"]["decode"]["max"] == named["pools"]["decode"]["max"]
        assert other["pools"]["decode"]["max"] == 3  # the second model's own policy
        assert default["pools"]["decode"]["max"] != 3
        pools = (await client.get("/admin/pools", params={"model": SECOND})).json()
        ids = {r["url"] for p in pools["pools"].values() for r in p["replicas"]}
        assert ids == {r.url for r in second.fleet.replicas()}
        assert not ids & {r.url for r in first.fleet.replicas()}
        # scaling the second model's decode pool leaves the first's alone
        done = await client.post(
            "/admin/pools/decode/scale", params={"model": SECOND}, json={"replicas": 2}
        )
        assert done.status_code == 200, done.text
        assert (_decode(two_models, SECOND), _decode(two_models, FIRST)) == (2, 1)
        # the dashboard's JSON follows the same rule
        board = (await client.get("/admin/dashboard.json", params={"model": SECOND})).json()
        assert board["autoscale"]["pools"]["decode"]["pinned"] == 2
        # an unknown model: 404 naming the served ones, on every admin route
        for method, path in (
            ("GET", "/admin/pools"),
            ("GET", "/admin/autoscale"),
            ("GET", "/admin/dashboard.json"),
            ("POST", "/admin/pools/decode/scale"),
            ("POST", "/admin/replicas/decode-0/drain"),
            ("GET", "/metrics"),
        ):
            missing = await client.request(
                method, path, params={"model": "llama-70b"}, json={"replicas": 1}
            )
            error = assert_openai_error(missing, 404)
            assert error["code"] == "model_not_found", error
            message = error["message"]
            assert f"`{FIRST}`" in message and f"`{SECOND}`" in message, (path, message)
        assert (_decode(two_models, SECOND), _decode(two_models, FIRST)) == (2, 1)


async def test_metrics_take_a_model(two_models: RunningCoordinator) -> None:
    async with http_client(base_url=two_models.url, timeout=30.0) as client:
        for _ in range(2):
            answer = await client.post(
                "/v1/completions",
                json={"model": SECOND, "prompt": long_prompt(), "max_tokens": 2},
            )
            assert answer.status_code == 200, answer.text
        ok = 'pdorch_requests_total{endpoint="completions",status="200"}'

        def served(page: str) -> float:
            lines = [line for line in page.splitlines() if line.startswith(ok)]
            return float(lines[0].split()[-1]) if lines else 0.0

        default = (await client.get("/metrics")).text
        second = (await client.get("/metrics", params={"model": SECOND})).text
        first = (await client.get("/metrics", params={"model": FIRST})).text
        assert served(second) == 2.0
        assert served(default) == served(first) == 0.0  # the default is the first model's
        assert "pdorch_time_to_first_token_seconds" in second  # the same metric names


async def test_scale_cli_takes_a_model(two_models: RunningCoordinator) -> None:
    url = two_models.url
    result = await _cli(
        "scale", "set", "decode", "+1", "--url", url, "--served-model-name", SECOND, "--json"
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["replicas"] == 2
    assert (_decode(two_models, SECOND), _decode(two_models, FIRST)) == (2, 1)
    result = await _cli("scale", "status", "--url", url, "--served-model-name", SECOND, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["pools"]["decode"]["pinned"] == 2
    result = await _cli("scale", "status", "--url", url, "--json")  # the first model
    assert json.loads(result.stdout)["pools"]["decode"]["pinned"] is None
    result = await _cli("scale", "status", "--url", url, "--served-model-name", SECOND)
    assert result.exit_code == 0 and f"model {SECOND}" in result.output, result.output
    result = await _cli("scale", "status", "--url", url, "--served-model-name", "llama-70b")
    assert result.exit_code == 1
    assert f"`{FIRST}`" in result.output and f"`{SECOND}`" in result.output, result.output


async def test_autoscale_cli_drives_one_model(
    two_models: RunningCoordinator, tmp_path: Path
) -> None:
    """`pdorch autoscale --served-model-name`: the decision is the named model's (its pools read and
    scaled through `?model=`); the first model records none."""
    policy = tmp_path / "remote-policy.yaml"
    policy.write_text(json.dumps({"pools": {"decode": {"min": 1, "max": 3}}}))
    args = ("autoscale", "--policy", str(policy), "--url", two_models.url, "--once")
    result = await _cli(*args, "--served-model-name", SECOND, "--interval-s", "0.5")
    assert result.exit_code == 0, result.output
    second = two_models.models[SECOND][0].scaling
    first = two_models.models[FIRST][0].scaling
    assert isinstance(second, ScalingControl) and isinstance(first, ScalingControl)
    assert second.autoscaler == "remote" and second.decisions, second.decisions
    assert first.autoscaler is None and not first.decisions
    result = await _cli(*args, "--served-model-name", "llama-70b", "--interval-s", "0.5")
    assert result.exit_code == 2, result.output  # the coordinator's 404: no metrics to read


async def test_openapi_describes_every_model_and_the_model_query(
    two_models: RunningCoordinator,
) -> None:
    async with http_client(base_url=two_models.url, timeout=30.0) as client:
        doc = (await client.get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    for body in ("CompletionRequest", "ChatCompletionRequest"):
        assert schemas[body]["properties"]["model"]["enum"] == [FIRST, SECOND]
    for path, ops in doc["paths"].items():
        if path.startswith("/admin/") or path == "/metrics":
            for op in ops.values():
                (query,) = [p for p in op["parameters"] if p["name"] == "model"]
                assert query["in"] == "query" and query["schema"]["enum"] == ["", FIRST, SECOND]
                assert "404" in op["responses"], path


async def test_an_unknown_query_parameter_is_a_400_naming_it(
    two_models: RunningCoordinator,
) -> None:
    async with http_client(base_url=two_models.url, timeout=30.0) as client:
        for path in ("/admin/pools", "/metrics"):
            answer = await client.get(path, params={"modle": SECOND})
            error = assert_openai_error(answer, 400)
            assert error["param"] == "modle" and "`modle`" in error["message"], path
        scaled = await client.post("/admin/pools/decode/scale?modle=code-3b", json={"delta": 1})
        assert_openai_error(scaled, 400)
    assert (_decode(two_models, SECOND), _decode(two_models, FIRST)) == (1, 1)
