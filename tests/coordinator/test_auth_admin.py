"""Client API keys, the admin token, run-time replicas and the explain API."""

from __future__ import annotations

import httpx

from pdorch.app.server import run_coordinator
from pools.http_client import http_client
from pools.ports import free_port
from pools.replica import ReplicaState
from pools.sim.server import SimServer
from pools.sim.settings import SimEngineSettings
from tests.coordinator.helpers import MODEL, assert_openai_error, fleet, long_prompt
from tests.waiting import async_wait_until


async def test_api_keys_and_admin_token() -> None:
    config = fleet(coordinator={"api_keys": ["sk-a", "sk-b"], "admin_token": "root"})
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        error = assert_openai_error(await client.post("/v1/completions", json=body), 401)
        assert error["code"] == "invalid_api_key"
        wrong = {"Authorization": "Bearer sk-c"}
        assert_openai_error(await client.post("/v1/completions", json=body, headers=wrong), 401)
        assert_openai_error(await client.get("/v1/models"), 401)
        for key in ("sk-a", "sk-b"):
            ok = await client.post(
                "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            assert ok.status_code == 200, ok.text

        assert_openai_error(await client.get("/admin/pools"), 401)
        forbidden = await client.get("/admin/pools", headers={"Authorization": "Bearer sk-a"})
        assert_openai_error(forbidden, 403)
        admin = {"Authorization": "Bearer root"}
        assert (await client.get("/admin/pools", headers=admin)).status_code == 200
        # health and metrics stay open (probes, Prometheus)
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200


async def test_add_and_remove_replicas_at_run_time_and_recovery() -> None:
    async with (
        run_coordinator(fleet()) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        # an endpoint that does not answer yet joins unhealthy...
        port = free_port()
        added = await client.post(
            "/admin/pools/decode/replicas",
            json={"url": f"http://127.0.0.1:{port}", "id": "late-decode"},
        )
        assert added.status_code == 201, added.text
        assert added.json()["state"] == "unhealthy"
        again = await client.post(
            "/admin/pools/decode/replicas",
            json={"url": f"http://127.0.0.1:{port}", "id": "late-decode"},
        )
        assert_openai_error(again, 409)
        assert_openai_error(
            await client.post("/admin/pools/nope/replicas", json={"url": "http://x:1"}), 404
        )
        assert_openai_error(
            await client.post("/admin/pools/decode/replicas", json={"url": "ftp://x"}), 400
        )
        # ...and comes into routing once it is healthy
        settings = SimEngineSettings.model_validate(
            {"port": port, "time_scale": 0.01, "kv_transport": "tcp", "served_model_name": MODEL}
        )
        engine = SimServer(settings)
        await engine.start()
        try:

            async def healthy() -> bool:
                replica = pd.coordinator.fleet.get("late-decode")
                return replica is not None and replica.state is ReplicaState.HEALTHY

            await async_wait_until(healthy, timeout=2.0, message="late-decode healthy")
            # the original decode replica leaves: requests go to the added one
            removed = await client.delete("/admin/pools/decode/replicas/decode-0")
            assert removed.status_code == 200
            view = (await client.get("/admin/pools")).json()
            assert [r["id"] for r in view["pools"]["decode"]["replicas"]] == ["late-decode"]
            response = await client.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": long_prompt(), "max_tokens": 3},
            )
            assert response.status_code == 200, response.text
            assert response.headers["x-pdorch-decode"] == "late-decode"
            assert response.headers["x-pdorch-prefill"] == "prefill-0"
        finally:
            await engine.stop()


async def test_explain_shows_scores_and_executes_nothing(client: httpx.AsyncClient) -> None:
    prompt = long_prompt()
    response = await client.post(
        "/admin/explain",
        json={"model": MODEL, "messages": [{"role": "user", "content": prompt}]},
    )
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["kind"] == "chat" and out["tokenized"] and out["block_keys"] > 0
    assert out["route"] == {
        "pool": "pd",
        "disaggregate": True,
        "prefill_replica": "prefill-0",
        "decode_replica": "decode-0",
    }
    decision = out["decision"]
    assert decision["pd"]["disaggregate"] is True
    for pick in (decision["prefill"], decision["decode"]):
        assert pick["chosen"] and pick["policy"]
        assert all(row["score"] is not None for row in pick["replicas"])
    view = (await client.get("/admin/pools")).json()
    assert view["tracked_requests"] == 0  # nothing was admitted
    metrics = (await client.get("/metrics")).text
    routed = [line for line in metrics.splitlines() if line.startswith("pdorch_routes_total{")]
    assert routed and all(line.endswith(" 0.0") for line in routed)  # created at 0, none counted
    assert_openai_error(await client.post("/admin/explain", json={"model": "x"}), 404)
