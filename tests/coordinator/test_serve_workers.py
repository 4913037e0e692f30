"""`pdorch serve --workers 2` as a real process tree: one port, two coordinator workers.

The supervisor runs the embedded demo (its simulated engines in the supervisor, real time);
each test reads the `--json` line for the shared URL and every worker's private URL (its own
`/metrics` and `/admin`), drives real HTTP and checks what each worker saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdorch.app.workers import RestartBackoff, worker_fleet_config
from pdorch.cli.serve import demo_fleet
from pdorch.config.fleet import parse_fleet_config
from pools.http_client import http_client
from pools.replica import ReplicaEndpoint
from tests.serve_process import PDORCH, serve_command
from tests.waiting import async_wait_until, wait_until

MODEL = "llama-3.1-8b"


@dataclass
class Workers:
    url: str
    workers: list[dict[str, Any]]
    process: subprocess.Popen[bytes]
    stderr: Path


@contextlib.contextmanager
def serve_workers(tmp_path: Path, n: int = 2) -> Iterator[Workers]:
    with serve_command(["--workers", str(n)], tmp_path, start_timeout_s=180) as (
        started,
        process,
        err,
    ):
        yield Workers(started["url"], started["workers"], process, err)


def _requests_total(metrics: str) -> float:
    return sum(
        float(m.group(1))
        for m in re.finditer(
            r'^pdorch_requests_total\{endpoint="completions"[^}]*\} (\S+)$', metrics, re.M
        )
    )


def _body(max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": "Tell me a story about the sea.",
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def test_two_workers_share_the_port_and_both_serve(tmp_path: Path) -> None:
    with serve_workers(tmp_path) as served:
        assert len(served.workers) == 2
        assert len({w["pid"] for w in served.workers}) == 2
        # a new connection per request: the kernel spreads connections, not requests
        n = 40
        async with httpx.AsyncClient(
            timeout=30.0, limits=httpx.Limits(max_keepalive_connections=0)
        ) as http:
            answers = await asyncio.gather(
                *(http.post(f"{served.url}/v1/completions", json=_body(4)) for _ in range(n))
            )
            assert [a.status_code for a in answers] == [200] * n
            counts = [
                _requests_total((await http.get(f"{w['url']}/metrics")).text)
                for w in served.workers
            ]
            assert sum(counts) == n
            assert min(counts) > 0, counts  # both workers got connections
            # scaling through any worker is refused, saying why (no silent one-worker change)
            scale = await http.post(f"{served.url}/admin/pools/decode/scale", json={"replicas": 3})
            assert scale.status_code == 409
            assert scale.json()["error"]["code"] == "fixed_fleet"
            drain = await http.post(f"{served.url}/admin/replicas/decode-0/drain", json={})
            assert drain.status_code == 409


async def test_token_load_added_on_one_worker_is_seen_on_the_other(tmp_path: Path) -> None:
    with serve_workers(tmp_path) as served:
        a, b = served.workers
        async with http_client(timeout=30.0) as http:

            async def in_flight(worker: dict[str, Any]) -> int:
                view = (await http.get(f"{worker['url']}/admin/pools")).json()
                return sum(
                    r["load"]["requests_in_flight"]
                    for pool in view["pools"].values()
                    for r in pool["replicas"]
                )

            assert await in_flight(b) == 0
            body = _body(1500, stream=True)
            async with http.stream("POST", f"{a['url']}/v1/completions", json=body) as resp:
                assert resp.status_code == 200
                chunks = resp.aiter_bytes()  # kept: a collected iterator closes the stream
                await anext(chunks)
                await async_wait_until(
                    lambda: in_flight(b), 5.0, message="worker B sees worker A's request"
                )
            await async_wait_until(
                lambda: _zero(in_flight(b)), 5.0, message="the release reaches worker B"
            )


async def _zero(value: Awaitable[int]) -> bool:
    return await value == 0


async def test_a_killed_worker_is_restarted(tmp_path: Path) -> None:
    with serve_workers(tmp_path) as served:
        victim = served.workers[1]
        os.kill(victim["pid"], signal.SIGKILL)
        restarted = re.compile(r"worker 1 restarted \(pid (\d+), (\S+)\)")
        match = wait_until(
            lambda: restarted.search(served.stderr.read_text()), 120, message="the restart"
        )
        assert int(match.group(1)) != victim["pid"]
        assert match.group(2) == victim["url"]  # same private port across restarts
        exited = f"worker 1 (pid {victim['pid']}) exited with status -9"
        assert exited in served.stderr.read_text()
        async with http_client(timeout=30.0) as http:
            assert (await http.get(f"{victim['url']}/health")).status_code == 200
            answer = await http.post(f"{victim['url']}/v1/completions", json=_body(4))
            assert answer.status_code == 200
        assert served.process.poll() is None


async def test_sigterm_drains_both_workers_without_losing_a_request(tmp_path: Path) -> None:
    with serve_workers(tmp_path) as served:
        n = 16

        async def one(http: httpx.AsyncClient) -> str:
            async with http.stream(
                "POST", f"{served.url}/v1/completions", json=_body(40, stream=True)
            ) as resp:
                assert resp.status_code == 200
                return "".join([chunk async for chunk in resp.aiter_text()])

        async with httpx.AsyncClient(
            timeout=30.0, limits=httpx.Limits(max_keepalive_connections=0)
        ) as http:
            tasks = [asyncio.ensure_future(one(http)) for _ in range(n)]

            async def both_busy() -> bool:
                pages = [(await http.get(f"{w['url']}/metrics")).text for w in served.workers]
                busy = [re.search(r"^pdorch_requests_in_flight (\S+)$", p, re.M) for p in pages]
                return all(m is not None and float(m.group(1)) > 0 for m in busy)

            await async_wait_until(both_busy, 20.0, message="requests in flight on both")
            served.process.send_signal(signal.SIGTERM)
            answers = await asyncio.gather(*tasks)
        assert all(a.rstrip().endswith("data: [DONE]") for a in answers), answers
        assert served.process.wait(timeout=60) == 0
        log = served.stderr.read_text()
        assert "restarting" not in log  # a drained worker is not a dead one


def test_workers_refuse_the_in_process_autoscaler(tmp_path: Path) -> None:
    policy = Path(__file__).parents[2] / "deploy" / "examples" / "slo-policy.yaml"
    result = subprocess.run(
        [*PDORCH, "serve", "--workers", "2", "--port", "0", "--slo-policy", str(policy)],
        capture_output=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert "autoscaler (--slo-policy / slo_policy:) needs --workers 1" in " ".join(
        result.stderr.decode().split()
    )


@pytest.mark.unit
def test_restart_backoff_doubles_to_its_cap_and_resets_after_a_stable_run() -> None:
    backoff = RestartBackoff(initial_s=0.5, factor=2.0, max_s=10.0, stable_s=30.0)
    assert [backoff.delay(f) for f in (1, 2, 3, 4, 5, 6, 7)] == [0.5, 1, 2, 4, 8, 10, 10]
    assert backoff.failures_after(previous=4, uptime_s=2.0) == 5  # a crash loop
    assert backoff.failures_after(previous=4, uptime_s=31.0) == 1  # it had recovered


@pytest.mark.unit
def test_worker_fleet_serves_the_launched_engines_as_static_endpoints() -> None:
    data = demo_fleet()
    data["coordinator"]["max_concurrent_requests"] = 5
    fleet = parse_fleet_config(data)
    endpoints = [
        ReplicaEndpoint(
            f"{pool}-{i}",
            pool,
            f"http://127.0.0.1:{9000 + 10 * j + i}",
            MODEL,
            16,
            kv_events_endpoint=f"ipc:///tmp/x/{pool}-{i}.ev",
            kv_events_topic=f"{pool}-{i}",
            kind="sim",
            launched=True,
        )
        for j, pool in enumerate(("prefill", "decode"))
        for i in range(2)
    ]
    sync = ["tcp://127.0.0.1:7001", "tcp://127.0.0.1:7002"]
    worker = parse_fleet_config(
        worker_fleet_config(fleet, endpoints, workers=2, sync_bind=sync[1], sync_peers=sync)
    )
    assert worker.pools.decode.launch == []
    assert [e.id for e in worker.pools.decode.endpoints] == ["decode-0", "decode-1"]
    assert worker.pools.prefill.endpoints[1].kv_events_endpoint == "ipc:///tmp/x/prefill-1.ev"
    assert worker.pools.decode.policy == fleet.pools.decode.policy
    assert worker.sync is not None and worker.sync.bind == sync[1]
    assert worker.sync.peers == sync
    assert worker.coordinator.workers == 1
    assert worker.coordinator.max_concurrent_requests == 3  # 5 over 2 workers, rounded up


def test_workers_exit_non_zero_when_the_port_is_taken(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:  # a plain listener, no SO_REUSEPORT: nobody may join it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*PDORCH, "serve", "--workers", "2", "--port", str(port)],
            capture_output=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    assert result.returncode == 1
    assert "cannot serve" in result.stderr.decode()
