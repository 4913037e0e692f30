"""Issue 14 item 4, the hardened edge: what reaches an engine, admin auth over every route,
the open-admin warning, the SSRF guard of run-time replicas."""

from __future__ import annotations

import ipaddress
import logging
import re
from typing import Any

import pytest
from fastapi.routing import APIRoute

from pdorch.app.auth import open_admin_warning
from pdorch.app.passthrough import PATHS as PASSTHROUGH_PATHS
from pdorch.app.server import run_coordinator
from pdorch.config.replica_allow import AllowError, ReplicaAllowList, check_host
from pools.http_client import http_client
from tests.coordinator.helpers import MODEL, assert_openai_error, fleet, long_prompt
from tests.coordinator.recording_engine import recording_engine

BOGUS_KV = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": "attacker",
    "remote_block_ids": [1, 2, 3],
    "remote_host": "169.254.169.254",
    "remote_port": 80,
}


async def test_client_kv_params_and_request_ids_never_reach_an_engine() -> None:
    async with (
        recording_engine("prefill") as prefill,
        recording_engine("decode") as decode,
    ):
        config = fleet(
            pools={
                "prefill": {"endpoints": [{"url": prefill.url, "id": "p0"}]},
                "decode": {"endpoints": [{"url": decode.url, "id": "d0"}]},
            },
        )
        async with (
            run_coordinator(config) as pd,
            http_client(base_url=pd.url, timeout=30.0) as client,
        ):
            for prompt in ("hi", long_prompt()):  # local and disaggregated routes
                shapes: tuple[tuple[str, dict[str, Any]], ...] = (
                    ("/v1/completions", {"prompt": prompt}),
                    ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]}),
                )
                for path, shape in shapes:
                    for _ in range(2):  # two clients, the same chosen request id
                        body = {
                            **shape,
                            "model": MODEL,
                            "max_tokens": 3,
                            "kv_transfer_params": BOGUS_KV,
                            "request_id": "mine",
                        }
                        response = await client.post(
                            path, json=body, headers={"X-Request-Id": "mine"}
                        )
                        assert response.status_code == 200, response.text
                        assert response.headers["x-request-id"] != "mine"
    legs = prefill.completions() + decode.completions()
    assert len(decode.completions()) == 8 and prefill.completions(), legs
    for leg in legs:
        params = leg.body.get("kv_transfer_params")
        # only the coordinator's own protocol fields: prefill asks for remote decode, decode
        # gets what the prefill engine answered, never the client's
        assert params is None or params.get("remote_engine_id") != "attacker", leg.body
        assert params is None or params.get("remote_host") != "169.254.169.254", leg.body
        assert leg.headers["x-request-id"] != "mine"
        assert "request_id" not in leg.body, leg.body
    # one id per client request, shared by its two legs only
    decode_ids = [leg.headers["x-request-id"] for leg in decode.completions()]
    assert len(set(decode_ids)) == 8
    prefill_ids = {leg.headers["x-request-id"] for leg in prefill.completions()}
    assert prefill_ids <= set(decode_ids)


def _fill(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "decode", path)


async def test_every_admin_route_needs_the_token() -> None:
    config = fleet(coordinator={"admin_token": "s3cret"})
    public = {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/health",
        "/metrics",
        "/openapi.json",
        "/dashboard",  # the status page's HTML: no data (it reads /admin/dashboard.json)
    }
    public |= set(PASSTHROUGH_PATHS)  # client routes (API keys), forwarded to an engine
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        routes = [r for r in pd.app.routes if isinstance(r, APIRoute)]
        admin = [(m, r.path) for r in routes for m in sorted(r.methods) if r.path not in public]
        # a new route is either public (listed above, on purpose) or admin: nothing in between
        assert all(path.startswith("/admin/") for _, path in admin), admin
        assert len(admin) >= 8, admin
        for method, path in admin:
            url = _fill(path)
            missing = await client.request(method, url, json={})
            assert_openai_error(missing, 401)
            for wrong in ("s3cre", "s3cret-", "S3CRET", "x" * 4096):
                denied = await client.request(
                    method, url, json={}, headers={"Authorization": f"Bearer {wrong}"}
                )
                assert_openai_error(denied, 403)
        # the right token gets past the guard (whatever the route then answers)
        ok = await client.get("/admin/pools", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
    # no admin change happened through any of those calls
    assert sorted(pd.coordinator.fleet.pools()) == ["decode", "prefill"]


def test_open_admin_warning_only_beyond_loopback() -> None:
    for host in ("127.0.0.1", "127.3.4.5", "::1", "[::1]", "localhost"):
        assert open_admin_warning(host, None) is None
    for host in ("0.0.0.0", "::", "", "10.1.2.3", "pdorch.example"):
        warning = open_admin_warning(host, None)
        assert warning is not None and "admin_token" in warning
        assert open_admin_warning(host, "t") is None


async def test_open_admin_on_all_interfaces_logs_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pdorch.app.server")
    async with run_coordinator(fleet(), host="0.0.0.0"):
        pass
    assert any("admin API" in r.getMessage() for r in caplog.records), caplog.text
    caplog.clear()
    async with run_coordinator(fleet()):
        pass
    assert not any("admin API" in r.getMessage() for r in caplog.records), caplog.text


def _addr(text: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    return [ipaddress.ip_address(text)]


def test_allow_list_decisions() -> None:
    allow = ReplicaAllowList()
    for ok in ("127.0.0.1", "10.2.3.4", "192.168.1.9", "172.20.0.5", "::1", "fd12::5"):
        check_host("url", ok, _addr(ok), allow)
    check_host("url", "localhost", [], allow)  # allowed by name, not resolved
    check_host("url", "engine-7", _addr("10.0.0.7"), allow)  # a name: its addresses decide
    refused = {
        "169.254.169.254": "denied network",
        "fe80::1": "denied network",
        "fd00:ec2::254": "denied network",  # inside fc00::/7 (allowed), denied wins
        "::ffff:169.254.169.254": "denied network",
        "0.0.0.0": "denied network",
        "8.8.8.8": "not in",
    }
    for host, why in refused.items():
        with pytest.raises(AllowError, match=why) as err:
            check_host("url", host, _addr(host), allow)
        assert host.removeprefix("::ffff:") in str(err.value)
    with pytest.raises(AllowError, match="metadata name"):
        check_host("url", "Metadata.Google.Internal.", _addr("10.0.0.1"), allow)
    with pytest.raises(AllowError, match=r"169\.254\.169\.254"):  # a name resolving to metadata
        check_host("url", "evil.example", [*_addr("10.0.0.1"), *_addr("169.254.169.254")], allow)
    with pytest.raises(AllowError, match="does not resolve"):
        check_host("url", "nowhere.invalid", [], allow)
    narrow = ReplicaAllowList(allowed_networks=["10.0.0.0/8"], allowed_hosts=[])
    with pytest.raises(AllowError, match="not in"):
        check_host("url", "127.0.0.1", _addr("127.0.0.1"), narrow)
    with pytest.raises(ValueError, match="not a network"):
        ReplicaAllowList(allowed_networks=["10.0.0.0/33"])


async def test_run_time_replicas_cannot_point_at_metadata_or_link_local() -> None:
    config = fleet(coordinator={"replica_allow": {"allowed_networks": ["127.0.0.0/8"]}})
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        before = sorted(r.replica_id for r in pd.coordinator.fleet.replicas("decode"))
        cases = [
            ({"url": "http://169.254.169.254"}, "url", "169.254.169.254"),
            ({"url": "http://[fe80::1]:8000"}, "url", "fe80::1"),
            ({"url": "http://metadata.google.internal"}, "url", "metadata.google.internal"),
            ({"url": "http://[::ffff:169.254.169.254]:80"}, "url", "169.254.169.254"),
            ({"url": "http://10.0.0.7:8000"}, "url", "10.0.0.7"),  # outside this allow-list
            (
                {"url": "http://127.0.0.1:9", "metrics_url": "http://169.254.170.2/v2"},
                "metrics_url",
                "169.254.170.2",
            ),
            (
                {"url": "http://127.0.0.1:9", "kv_events_endpoint": "tcp://169.254.169.254:5557"},
                "kv_events_endpoint",
                "169.254.169.254",
            ),
        ]
        for body, field, address in cases:
            answer = await client.post("/admin/pools/decode/replicas", json=body)
            error = assert_openai_error(answer, 403)
            assert error["code"] == "replica_address_refused"
            assert error["param"] == field and address in error["message"], error
        after = sorted(r.replica_id for r in pd.coordinator.fleet.replicas("decode"))
        assert after == before
        allowed = await client.post(
            "/admin/pools/decode/replicas", json={"url": "http://127.0.0.1:9", "id": "lo"}
        )
        assert allowed.status_code == 201, allowed.text
