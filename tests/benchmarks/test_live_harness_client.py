"""The live client's failure detection against a misbehaving real HTTP server, and the summary.

`FakeMisbehavingOpenAI` is a named fake: no real engine truncates streams or sends an `error`
chunk on demand, so a tiny FastAPI app served on loopback (`tests/threaded_server.py`) does it
here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from benchmarks.live.client import RequestResult, stream_request
from benchmarks.live.runner import LiveRun
from benchmarks.live.summary import summarize
from benchmarks.workloads import Segment, SessionSpec, TurnSpec, Workload
from pools.http_client import http_client


def _fake_app() -> object:
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI()

    def sse(obj: str) -> bytes:
        return f"data: {obj}\n\n".encode()

    chunk = '{"choices":[{"index":0,"delta":{"content":" word"}}]}'

    @app.post("/{mode}/v1/chat/completions")
    async def chat(mode: str) -> object:
        if mode == "status500":
            return JSONResponse(
                {"error": {"message": "engine exploded", "type": "InternalServerError"}}, 500
            )

        async def body() -> AsyncIterator[bytes]:
            yield sse('{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}')
            for _ in range(3):
                await asyncio.sleep(0.01)
                yield sse(chunk)
            if mode == "truncated":
                return
            if mode == "error":
                yield sse('{"error":{"message":"kv load failed","code":500}}')
                return
            yield sse('{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}')
            yield sse("[DONE]")

        return StreamingResponse(body(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def fake_url() -> Iterator[str]:
    from tests.threaded_server import ThreadedHttpServer

    with ThreadedHttpServer(_fake_app()) as server:
        yield server.url


def _run(url: str) -> RequestResult:
    async def go() -> RequestResult:
        async with http_client(trust_env=False) as client:
            r = RequestResult("s", 0, None, 0.0)
            payload = {"model": "m", "messages": [], "stream": True}
            return await stream_request(client, url, payload, r, clock_origin=0.0, timeout_s=10.0)

    return asyncio.run(go())


def test_well_formed_stream(fake_url: str) -> None:
    r = _run(f"{fake_url}/ok/v1/chat/completions")
    assert r.ok and r.output_tokens == 3 and r.prompt_tokens == 5
    assert r.ttft_s is not None and r.ttft_s > 0 and len(r.itl_s) == 2  # role-only chunk skipped
    assert r.tpot_s is not None and r.tpot_s > 0


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("truncated", "stream ended without [DONE]"),
        ("error", "stream error: kv load failed"),
        ("status500", "HTTP 500: engine exploded"),
    ],
)
def test_failures_are_errors_with_messages(fake_url: str, mode: str, message: str) -> None:
    r = _run(f"{fake_url}/{mode}/v1/chat/completions")
    assert not r.ok and r.error is not None and r.error.startswith(message), r.error


def test_connection_refused_is_an_error() -> None:
    from tests.ports import free_port

    r = _run(f"http://127.0.0.1:{free_port()}/v1/chat/completions")
    assert r.error is not None and "ConnectError" in r.error


def _result(
    sid: str, group: str | None, start: float, end: float, ttft: float, out: int
) -> RequestResult:
    r = RequestResult(sid, 0, group, start, end_s=end, ttft_s=ttft, output_tokens=out)
    r.itl_s = [(end - start - ttft) / max(out - 1, 1)] * (out - 1)
    return r


@pytest.mark.unit
def test_summary_metrics_and_group_latency() -> None:
    def session(sid: str, group: str) -> SessionSpec:
        return SessionSpec(sid, None, [TurnSpec([Segment(1, 4)], 5)], group=group)

    wl = Workload("w", [session("a", "g1"), session("b", "g1"), session("c", "g2")], 2)
    results = [
        _result("a", "g1", 0.0, 1.0, 0.1, 5),
        _result("b", "g1", 0.5, 3.0, 0.3, 5),
        _result("c", "g2", 1.0, 2.0, 0.2, 5),
    ]
    results[2].error = "HTTP 400: too long"
    s = summarize(LiveRun(results, wall_s=3.5, planned_requests=3), wl)
    assert s["completed"] == 2 and s["errors"] == 1 and s["cancelled"] == 0
    assert s["ttft_p50_ms"] == pytest.approx(200.0)
    assert s["output_tokens"] == 10
    assert s["output_tokens_per_s"] == pytest.approx(10 / 3.0)  # first start to last end
    assert s["requests_per_s"] == pytest.approx(2 / 3.0)
    assert s["rollouts_planned"] == 2 and s["rollouts_completed"] == 1  # g2 failed
    assert s["rollout_p99_s"] == pytest.approx(3.0)
    assert s["error_samples"] == ["HTTP 400: too long"]
    assert s["prompt_tokens_ratio"] is None  # the server reported no usage
    empty = summarize(LiveRun([], wall_s=0.1, planned_requests=0), Workload("e", []))
    assert empty["completed"] == 0 and empty["ttft_p99_ms"] is None
