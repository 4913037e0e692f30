"""A request's own fault never counts against a replica (issue 14, hole 1); an engine's does.

Real processes and HTTP: simulated engines as separate processes, and one real HTTP server
(`failing_engine`) that answers 500 to every completion while its `/health` says 200 (an
engine that is up but cannot serve, or a poison request that fails everywhere).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pdorch.app.faults import RequestFaults
from pdorch.app.server import RunningCoordinator, run_coordinator
from pools.fleet import FailureKind
from pools.http_client import http_client
from pools.inloop_server import InLoopHttpServer
from pools.ports import free_port
from pools.replica import ReplicaState
from tests.coordinator.helpers import (
    MODEL,
    assert_openai_error,
    fleet,
    long_prompt,
    sim,
    sse_events,
)

OUT_OF_VOCABULARY = 99999999999


def _states(pd: RunningCoordinator) -> dict[str, tuple[ReplicaState, int]]:
    return {
        r.replica_id: (r.state, r.consecutive_failures) for r in pd.coordinator.fleet.replicas()
    }


async def test_out_of_vocabulary_requests_leave_every_replica_healthy() -> None:
    # 2P+2D separate processes; probes slowed down so only the request path could eject
    config = fleet(
        prefill=[sim(2, in_process=False)],
        decode=[sim(2, in_process=False)],
        health={"interval_s": 60},
    )
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        bad = {"model": MODEL, "prompt": [OUT_OF_VOCABULARY], "max_tokens": 4}
        good = {"model": MODEL, "prompt": long_prompt(), "max_tokens": 4}
        answers = await asyncio.gather(
            *(client.post("/v1/completions", json=bad) for _ in range(3)),
            *(client.post("/v1/completions", json={**bad, "stream": True}) for _ in range(3)),
            *(client.post("/v1/completions", json=good) for _ in range(4)),
        )
        for answer in answers[:6]:
            error = assert_openai_error(answer, 400)
            assert f"Token id {OUT_OF_VOCABULARY} is out of vocabulary" in error["message"]
        for answer in answers[6:]:
            assert answer.status_code == 200, answer.text
        states = _states(pd)
        assert states == {rid: (ReplicaState.HEALTHY, 0) for rid in states}, states
        # other clients are served (no 503), on both decode replicas' pool
        for _ in range(4):
            response = await client.post("/v1/completions", json=good)
            assert response.status_code == 200, response.text
        view = (await client.get("/admin/pools")).json()
        assert view["tracked_requests"] == 0 and view["requests_in_flight"] == 0


def _failing_app() -> Starlette:
    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def fail(_: Request) -> Response:
        body = {"message": "engine broke", "type": "InternalServerError", "param": None}
        return JSONResponse({"error": {**body, "code": 500}}, status_code=500)

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/completions", fail, methods=["POST"]),
            Route("/v1/chat/completions", fail, methods=["POST"]),
        ]
    )


@asynccontextmanager
async def failing_engine() -> AsyncIterator[str]:
    server = InLoopHttpServer(_failing_app(), "127.0.0.1", 0)
    await server.start()
    try:
        assert server.url is not None
        yield server.url
    finally:
        await server.stop()


async def test_a_5xx_no_replica_can_serve_is_not_counted() -> None:
    async with failing_engine() as url:
        config = fleet(
            pools={
                "prefill": {"launch": [sim()]},
                "decode": {"endpoints": [{"url": url, "id": "decode-failing"}]},
            },
        )
        async with (
            run_coordinator(config) as pd,
            http_client(base_url=pd.url, timeout=30.0) as client,
        ):
            body = {"model": MODEL, "prompt": long_prompt(), "max_tokens": 3}
            for _ in range(6):
                error = assert_openai_error(await client.post("/v1/completions", json=body), 502)
                assert error["code"] == "decode_failed"
            # no other replica served those requests: nothing says the engine is at fault
            states = _states(pd)
            assert states["decode-failing"] == (ReplicaState.HEALTHY, 0), states


async def test_a_5xx_another_replica_serves_counts_and_ejects() -> None:
    async with failing_engine() as url:
        config = fleet(
            pools={
                "prefill": {"launch": [sim()]},
                "decode": {
                    "policy": {"name": "round_robin"},  # the failing engine gets its turns
                    "endpoints": [{"url": url, "id": "decode-failing"}],
                    "launch": [sim()],
                },
            },
        )
        async with (
            run_coordinator(config) as pd,
            http_client(base_url=pd.url, timeout=30.0) as client,
        ):
            fleet_ = pd.coordinator.fleet
            failing = fleet_.get("decode-failing")
            assert failing is not None
            served_by: set[str] = set()
            for _ in range(40):
                if failing.state is ReplicaState.UNHEALTHY:
                    break
                body = {"model": MODEL, "prompt": long_prompt(), "max_tokens": 3}
                response = await client.post("/v1/completions", json=body)
                assert response.status_code == 200, response.text  # retried on the sim
                served_by.add(response.headers["x-pdorch-decode"])
            assert failing.state is ReplicaState.UNHEALTHY, (failing.last_error, served_by)
            assert failing.last_error is not None and "served by" in failing.last_error


@pytest.mark.unit
def test_request_faults_hold_5xx_until_another_replica_serves() -> None:
    reported: list[tuple[str, FailureKind, str]] = []

    def report(replica: str, kind: FailureKind, detail: str) -> None:
        reported.append((replica, kind, detail))

    faults = RequestFaults(report)
    faults.failed("p0", None, "prefill answered 400")  # a 4xx: never a health signal
    faults.failed("p0", FailureKind.HTTP_5XX, "prefill answered 500")
    faults.failed("d0", FailureKind.CONNECTION, "refused")  # an engine fault: at once
    assert reported == [("d0", FailureKind.CONNECTION, "refused")]
    faults.failed("d1", FailureKind.HTTP_5XX, "decode answered 500")
    faults.served("d2")
    assert [(r, k) for r, k, _ in reported[1:]] == [
        ("p0", FailureKind.HTTP_5XX),
        ("d1", FailureKind.HTTP_5XX),
    ]
    assert all("served by d2" in d for _, _, d in reported[1:])

    again = RequestFaults(report)
    again.failed("d0", FailureKind.HTTP_5XX, "decode answered 500")
    again.served("d0")  # the same replica served it after all: its 5xx is not confirmed
    assert len(reported) == 3


def _poisoned_prefill_app(dead_port: int) -> Starlette:
    """A prefill engine whose KV can never be pulled: its params name a side channel nobody
    listens on (what a decode engine meets when the prefill engine died after answering)."""

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def prefill(request: Request) -> Response:
        body = await request.json()
        params = {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "remote_engine_id": "gone",
            "remote_host": "127.0.0.1",
            "remote_port": dead_port,
            "remote_block_ids": [[1, 2, 3]],
            "remote_request_id": "gone-1",
            "remote_num_tokens": 48,
        }
        choice = {"index": 0, "text": "x", "finish_reason": "length", "logprobs": None}
        return JSONResponse(
            {
                "id": "cmpl-gone",
                "object": "text_completion",
                "model": body["model"],
                "choices": [choice],
                "usage": {"prompt_tokens": 48, "completion_tokens": 1, "total_tokens": 49},
                "kv_transfer_params": params,
            }
        )

    return Starlette(
        routes=[Route("/health", health), Route("/v1/completions", prefill, methods=["POST"])]
    )


async def test_a_failed_kv_load_before_the_first_token_is_retried_and_not_counted() -> None:
    server = InLoopHttpServer(_poisoned_prefill_app(free_port()), "127.0.0.1", 0)
    await server.start()
    try:
        assert server.url is not None
        config = fleet(
            pools={
                "prefill": {"endpoints": [{"url": server.url, "id": "prefill-poisoned"}]},
                "decode": {"launch": [sim(2)]},
            },
        )
        async with (
            run_coordinator(config) as pd,
            http_client(base_url=pd.url, timeout=30.0) as client,
        ):
            for stream in (True, False):
                body = {"model": MODEL, "prompt": long_prompt(), "max_tokens": 4, "stream": stream}
                response = await client.post("/v1/completions", json=body)
                assert response.status_code == 200, response.text
                if stream:  # one clean stream: no error event reached the client
                    events = sse_events(response.text)
                    assert events[-1] == "[DONE]", events
                    assert not any("error" in e for e in events[:-1]), events
                else:
                    assert response.json()["usage"]["completion_tokens"] == 4
            states = _states(pd)
            for decode in ("decode-0", "decode-1"):
                assert states[decode][0] is ReplicaState.HEALTHY, states
            metrics = (await client.get("/metrics")).text
            assert "pdorch_decode_retries_total 2.0" in metrics, metrics[:2000]
    finally:
        await server.stop()
