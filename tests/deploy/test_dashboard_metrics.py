"""Every PromQL expression pdorch ships (the Grafana dashboard, the PrometheusRule) names metrics
that a live coordinator or a real vLLM engine exports; the dashboard is well formed; the
engines' preStop hook takes a replica out of a live coordinator's routing and waits for the
request in flight.

The coordinator is a real `pdorch serve` over simulated engines (with peer sync, client keys
and a scale-up and scale-down, so every series the dashboard reads exists); vLLM's names come
from the real capture in tests/fixtures/vllm/ (no vLLM is started here).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from tests.data import VLLM_FIXTURES, require_file
from tests.deploy.kustomize import KUBERNETES, REPO, rule_exprs
from tests.deploy.promql import exposed_names, metric_names
from tests.ports import free_port
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

PDORCH = [sys.executable, "-c", "from pdorch.cli import main; main()"]
DASHBOARD = REPO / "deploy" / "grafana" / "pdorch.json"
VLLM_CAPTURES = [
    VLLM_FIXTURES / name for name in ("metrics_single.txt", "metrics_decode_after.txt")
]
PRESTOP = KUBERNETES / "base" / "engine-prestop.py"
KEY = "client-key"
ADMIN_TOKEN = "admin-token-0123"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MODEL = "llama-3.1-8b"


def _dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expr) of every query in the dashboard, rows' nested panels included."""
    found: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                found.append((panel["title"], target["expr"]))
            walk(panel.get("panels", []))

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return found


FLEET = {
    "served_model_name": MODEL,
    "block_size": 16,
    "pools": {
        "prefill": {"launch": [{"kind": "sim", "count": 1, "model_profile": MODEL}]},
        "decode": {"launch": [{"kind": "sim", "count": 1, "model_profile": MODEL}]},
    },
    "pd": {"min_uncached_tokens": 16},  # the test's prompt goes P/D
    "tokenizer": {"mode": "engine"},
    # a request without the key makes pdorch_rejected_total; the hook sends the admin token
    "coordinator": {"api_keys": [KEY], "admin_token": ADMIN_TOKEN},
    "sync": {"bind": "tcp://127.0.0.1:0", "peers": []},  # the pdorch_sync_* series
}


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("serve")
    fleet = workdir / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(FLEET))
    port = free_port()
    log = workdir / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*PDORCH, "serve", "--config", str(fleet), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: _healthy(url) or process.poll() is not None, timeout=120, message="serve up"
        )
        assert process.poll() is None, log.read_text()
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def _pool(url: str, pool: str) -> dict[str, Any]:
    view: dict[str, Any] = httpx.get(f"{url}/admin/autoscale", headers=ADMIN, timeout=5).json()[
        "pools"
    ][pool]
    return view


def _scale(url: str, pool: str, replicas: int) -> None:
    body = {"replicas": replicas, "source": "autoscaler", "reason": "dashboard test"}
    answer = httpx.post(f"{url}/admin/pools/{pool}/scale", json=body, headers=ADMIN, timeout=10)
    assert answer.status_code == 200, answer.text


@pytest.fixture(scope="module")
def coordinator_metrics(coordinator: str) -> set[str]:
    """The coordinator's series names after traffic, a rejection and a scale-up and -down."""
    url = coordinator
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "word " * 64}],
        "max_tokens": 8,
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as answer:
        assert answer.status_code == 200
        assert "[DONE]" in "".join(answer.iter_text())
    assert httpx.get(f"{url}/v1/models", timeout=5).status_code == 401
    _scale(url, "decode", 2)
    wait_until(lambda: _pool(url, "decode")["ready"] == 2, timeout=60, message="decode up to 2")
    _scale(url, "decode", 1)
    wait_until(
        lambda: (v := _pool(url, "decode"))["ready"] == 1 and v["draining"] == 0,
        timeout=60,
        message="decode drained to 1",
    )
    return exposed_names(httpx.get(f"{url}/metrics", timeout=5).text)


def _vllm_names() -> set[str]:
    names: set[str] = set()
    for capture in VLLM_CAPTURES:
        names |= exposed_names(require_file(capture).read_text())
    return names


def test_every_query_names_metrics_that_are_exported(coordinator_metrics: set[str]) -> None:
    vllm = _vllm_names()
    exprs = _dashboard_exprs() + rule_exprs()
    assert len(exprs) > 20
    unknown = []
    for where, expr in exprs:
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        for name in names:
            known = vllm if name.startswith("vllm:") else coordinator_metrics
            if name not in known:
                unknown.append(f"{where}: {name}")
    assert not unknown, "not exported:\n" + "\n".join(unknown)


def test_the_dashboard_covers_what_operators_look_for() -> None:
    used = set().union(*(metric_names(expr) for _, expr in _dashboard_exprs()))
    for needed in (
        "pdorch_time_to_first_token_seconds_bucket",  # TTFT against the SLO
        "pdorch_inter_token_latency_seconds_bucket",  # ITL against the SLO
        "pdorch_requests_total",  # request rate
        "pdorch_replica_prefill_tokens_queued",  # token load
        "pdorch_replica_decode_blocks",
        "vllm:kv_cache_usage_perc",  # KV usage
        "vllm:prefix_cache_hits_total",  # prefix hit rate
        "pdorch_routes_total",  # P/D vs local
        "vllm:nixl_bytes_transferred_sum",  # KV transfer volume
        "pdorch_pool_replicas",  # ready / pending / draining
        "pdorch_autoscale_desired",  # desired
        "pdorch_autoscale_decisions_total",  # autoscaler decisions
    ):
        assert needed in used, needed
    dashboard = json.loads(DASHBOARD.read_text())
    thresholds = {
        panel["title"]: panel["fieldConfig"]["defaults"]["thresholds"]["steps"][-1]["value"]
        for panel in dashboard["panels"]
        if panel.get("title", "").startswith(("TTFT p50", "ITL p50"))
    }
    policy = yaml.safe_load((KUBERNETES / "base" / "slo-policy.yaml").read_text())["slo"]
    assert thresholds == {
        "TTFT p50 / p90 / p99 per pool (SLO: 2 s)": policy["ttft_ms"]["target"] / 1000,
        "ITL p50 / p90 / p99 per pool (SLO: 50 ms)": policy["itl_ms"]["target"] / 1000,
    }


def test_dashboard_panels_are_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "pool"}
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            # a per-pool query follows the dashboard's pool filter
            if "by (pool" in target["expr"] or "by (le, pool" in target["expr"]:
                assert 'pool=~"$pool"' in target["expr"], target["expr"]


def _replica_url(url: str, pool: str, replica: str) -> str | None:
    pools = httpx.get(f"{url}/admin/pools", headers=ADMIN, timeout=5).json()["pools"]
    for row in pools[pool]["replicas"]:
        if row["id"] == replica:
            found: str = row["url"]
            return found
    return None


def _prestop(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PRESTOP)],
        env={"PATH": os.environ.get("PATH", ""), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_prestop_hook_takes_the_replica_out_of_routing(
    coordinator: str, coordinator_metrics: set[str]
) -> None:
    del coordinator_metrics  # after the scaling steps: the fleet is settled
    url = coordinator
    engine = _replica_url(url, "prefill", "prefill-0")
    assert engine is not None
    nobody = f"http://127.0.0.1:{free_port()}"  # a coordinator that is down
    env = {
        "PDORCH_COORDINATORS": f"{url},{nobody}",
        "PDORCH_POOL": "prefill",
        "POD_NAME": "prefill-0",
        "PDORCH_ENGINE_URL": engine,
        "PDORCH_DRAIN_TIMEOUT_S": "20",
        "PDORCH_LEAVE_TIMEOUT_S": "1",
        "PDORCH_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    refused = _prestop({**env, "PDORCH_ADMIN_TOKEN": "wrong", "PDORCH_COORDINATORS": url})
    assert refused.returncode == 0  # a preStop never fails the pod's stop; it says why
    assert f"{url}: HTTP 403" in refused.stderr
    assert _replica_url(url, "prefill", "prefill-0") == engine
    done = _prestop(env)
    assert done.returncode == 0, done.stderr
    assert _replica_url(url, "prefill", "prefill-0") is None
    # drained through the coordinator first (its requests and KV leases), then removed
    assert f"{url}: drained prefill-0" in done.stderr
    assert f"{url}: removed prefill-0 from prefill (200)" in done.stderr
    assert f"{nobody}: never reached" in done.stderr
    assert "prefill-0 drained" in done.stderr  # the idle engine reported 0 requests
    again = _prestop({**env, "PDORCH_COORDINATORS": url})
    assert again.returncode == 0
    assert f"{url}: prefill-0 not in prefill (404)" in again.stderr


def test_prestop_hook_waits_for_the_request_in_flight(
    coordinator: str, coordinator_metrics: set[str]
) -> None:
    """A stream of 600 tokens (~3 s on the simulated H100) is running on the decode replica
    when the hook starts: the hook takes the replica out of routing, and returns only once
    the engine has finished it; the stream itself completes."""
    del coordinator_metrics
    url = coordinator
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "word " * 64}],
        "max_tokens": 600,
        "stream": True,
    }
    started = threading.Event()
    result: dict[str, Any] = {}

    def stream() -> None:
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60
        ) as answer:
            result["decode"] = answer.headers["x-pdorch-decode"]
            events = 0
            for line in answer.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    events += 1
                    if events == 20:
                        started.set()
            result["events"] = events
            result["ended"] = time.monotonic()

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        assert started.wait(30), "the stream did not start"
        replica = result["decode"]
        engine = _replica_url(url, "decode", replica)
        assert engine is not None
        hook_started = time.monotonic()
        done = _prestop(
            {
                "PDORCH_COORDINATORS": url,
                "PDORCH_POOL": "decode",
                "POD_NAME": replica,
                "PDORCH_ENGINE_URL": engine,
                "PDORCH_DRAIN_TIMEOUT_S": "30",
                "PDORCH_ADMIN_TOKEN": ADMIN_TOKEN,
            }
        )
        hook_ended = time.monotonic()
    finally:
        thread.join(60)
    assert done.returncode == 0 and f"{replica} drained" in done.stderr, done.stderr
    assert _replica_url(url, "decode", replica) is None
    assert result["events"] >= 600  # the request in flight was not cut
    assert result["ended"] - hook_started > 1.0  # the hook began well before the stream ended
    assert hook_ended >= result["ended"] - 0.5  # and returned only after (engine done first)
