"""Bad input and overload: OpenAI-shaped errors with the right status, never a 500."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdorch.app.admission import CoordinatorLimits
from pdorch.app.server import run_coordinator
from pdorch.config.fleet import FleetConfigError, load_fleet_config
from pools.http_client import http_client
from pools.ports import free_port
from tests.coordinator.helpers import MODEL, assert_openai_error, fleet, long_prompt, sim
from tests.waiting import async_wait_until


@pytest.mark.parametrize(
    ("path", "content", "status", "param"),
    [
        ("/v1/completions", b"{not json", 400, None),
        ("/v1/completions", b"[1, 2]", 400, None),
        ("/v1/completions", b'{"prompt": "hi"}', 400, "model"),
        ("/v1/completions", b'{"model": "other", "prompt": "hi"}', 404, "model"),
        ("/v1/completions", b'{"model": "sim-8b"}', 400, "prompt"),
        ("/v1/completions", b'{"model": "sim-8b", "prompt": ""}', 400, "prompt"),
        ("/v1/completions", b'{"model": "sim-8b", "prompt": ["a", [1]]}', 400, "prompt"),
        (
            "/v1/completions",
            b'{"model": "sim-8b", "prompt": "hi", "max_tokens": 0}',
            400,
            "max_tokens",
        ),
        ("/v1/completions", b'{"model": "sim-8b", "prompt": "hi", "stream": "yes"}', 400, "stream"),
        ("/v1/completions", b'{"model": "sim-8b", "prompt": "hi", "n": 0}', 400, "n"),
        ("/v1/chat/completions", b'{"model": "sim-8b", "messages": []}', 400, "messages"),
        (
            "/v1/chat/completions",
            b'{"model": "sim-8b", "messages": [{"content": "x"}]}',
            400,
            "messages[0]",
        ),
    ],
)
async def test_bad_requests(
    client: httpx.AsyncClient, path: str, content: bytes, status: int, param: str | None
) -> None:
    response = await client.post(path, content=content)
    error = assert_openai_error(response, status)
    assert error["param"] == param


async def test_unknown_route_and_method(client: httpx.AsyncClient) -> None:
    assert_openai_error(await client.post("/v1/embeddings", json={}), 404)
    assert_openai_error(await client.get("/v1/completions"), 405)
    assert_openai_error(await client.delete("/admin/pools/decode/replicas/nope"), 404)


async def test_engine_4xx_is_passed_through(client: httpx.AsyncClient) -> None:
    # the engine refuses a prompt longer than its max_model_len (8192): its own 400
    response = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": list(range(9000)), "max_tokens": 2}
    )
    assert_openai_error(response, 400)


async def test_body_limit_concurrency_limit_and_no_replica() -> None:
    config = fleet(decode=[sim(time_scale=1.0)])
    limits = CoordinatorLimits(max_body_bytes=4096, max_concurrent_requests=1)
    async with (
        run_coordinator(config, limits=limits) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        big = {"model": MODEL, "prompt": "x" * 5000}
        error = assert_openai_error(await client.post("/v1/completions", json=big), 413)
        assert error["code"] == "request_too_large"

        slow: dict[str, Any] = {
            "model": MODEL,
            "prompt": long_prompt(),
            "max_tokens": 3000,
            "stream": True,
        }
        async with client.stream("POST", "/v1/completions", json=slow) as held:
            assert held.status_code == 200
            chunks = held.aiter_raw()  # referenced: a collected iterator closes the stream
            await anext(chunks)
            busy = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
            assert_openai_error(busy, 429)
            assert busy.headers["retry-after"] == "1"

        # no decode replica left: 503 on requests and on /health
        assert (await client.delete("/admin/pools/decode/replicas/decode-0")).status_code == 200

        # the held stream's slot is released once its connection is gone
        async def released() -> bool:
            return pd.coordinator.in_flight == 0

        await async_wait_until(released, timeout=5.0, message="slot released")
        response = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
        assert_openai_error(response, 503)
        assert_openai_error(await client.get("/health"), 503)
        metrics = (await client.get("/metrics")).text
        assert 'pdorch_rejected_total{reason="concurrency"}' in metrics
        assert 'pdorch_rejected_total{reason="body_size"} 1.0' in metrics


async def test_every_decode_attempt_failing_is_502_and_deadline_is_504() -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: connections are refused
    config = fleet(
        decode=[],
        pools={"decode": {"endpoints": [{"url": dead, "id": "decode-dead"}]}},
        # probes alone would eject it at once; here the request path has to find out
        health={"probe_failures_to_eject": 1000},
    )
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        body = {"model": MODEL, "prompt": long_prompt(), "max_tokens": 3}
        error = assert_openai_error(await client.post("/v1/completions", json=body), 502)
        assert error["code"] == "decode_failed" and "decode-dead" in error["message"]
        view = (await client.get("/admin/pools")).json()
        assert view["tracked_requests"] == 0 and view["requests_in_flight"] == 0
        # ejected by that failure: nobody can serve now
        assert_openai_error(await client.post("/v1/completions", json=body), 503)

    slow = fleet(
        prefill=[sim(time_scale=300.0)],
        coordinator={"request_timeout_s": 0.5, "prefill_timeout_s": 30},
    )
    async with (
        run_coordinator(slow) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        body = {"model": MODEL, "prompt": long_prompt(words=400), "max_tokens": 3}
        error = assert_openai_error(await client.post("/v1/completions", json=body), 504)
        assert error["code"] == "timeout"
        assert pd.coordinator.in_flight == 0


LIMITED_FLEET_YAML = """\
served_model_name: sim-8b
pools:
  prefill:
    launch: [{kind: sim, count: 1, model_profile: llama-3.1-8b, gpu: h100, time_scale: 0.01,
              kv_transport: tcp}]
  decode:
    launch: [{kind: sim, count: 1, model_profile: llama-3.1-8b, gpu: h100, time_scale: 1.0,
              kv_transport: tcp}]
pd: {min_uncached_tokens: 32}
health: {timeout_s: 2.0}
coordinator:
  port: 0
  max_body_bytes: 4096
  max_concurrent_requests: 1
"""


async def test_limits_from_the_fleet_file_give_413_and_429(tmp_path: Path) -> None:
    """`coordinator.max_body_bytes` / `max_concurrent_requests` in the YAML are enforced."""
    path = tmp_path / "fleet.yaml"
    path.write_text(LIMITED_FLEET_YAML)
    config = load_fleet_config(path)
    assert config.coordinator.max_body_bytes == 4096
    assert config.coordinator.max_concurrent_requests == 1
    async with (
        run_coordinator(config) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):
        assert pd.coordinator.limits == CoordinatorLimits(4096, 1)
        big = {"model": MODEL, "prompt": "x" * 5000}
        error = assert_openai_error(await client.post("/v1/completions", json=big), 413)
        assert error["code"] == "request_too_large"
        small = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
        assert (await client.post("/v1/completions", json=small)).status_code == 200

        slow = {"model": MODEL, "prompt": long_prompt(), "max_tokens": 3000, "stream": True}
        async with client.stream("POST", "/v1/completions", json=slow) as held:
            assert held.status_code == 200
            chunks = held.aiter_raw()  # referenced: a collected iterator closes the stream
            await anext(chunks)
            busy = await client.post("/v1/completions", json=small)
            error = assert_openai_error(busy, 429)
            assert error["code"] == "concurrency_limit"

        async def released() -> bool:
            return pd.coordinator.in_flight == 0

        await async_wait_until(released, timeout=5.0, message="slot released")
        assert (await client.post("/v1/completions", json=small)).status_code == 200


@pytest.mark.unit
def test_coordinator_limits_default_and_validation() -> None:
    config = fleet()
    assert config.coordinator.max_body_bytes == 32 * 1024 * 1024
    assert config.coordinator.max_concurrent_requests is None
    assert CoordinatorLimits.from_settings(config.coordinator) == CoordinatorLimits()
    with pytest.raises(FleetConfigError, match=r"coordinator\.max_concurrent_requests"):
        fleet(coordinator={"max_concurrent_requests": 0})


def _nested(depth: int) -> bytes:
    return b'{"model": "sim-8b", "prompt": "hi", "x": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize(
    ("path", "content", "status", "code"),
    [
        ("/v1/completions", _nested(100_000), 400, "invalid_json"),
        ("/v1/chat/completions", b'{"messages": ' + b"[" * 100_000, 400, "invalid_json"),
        ("/v1/completions", b'{"model": "sim-8b", "prompt": "\xff\xfe"}', 400, "invalid_json"),
        ("/v1/completions", b'\xef\xbb\xbf{"model": "sim-8b"}', 400, "invalid_json"),
        ("/v1/completions", b'{"model": 7, "prompt": "hi"}', 400, None),
        ("/v1/completions", b'{"model": "sim-8b", "prompt": 7}', 400, None),
        ("/v1/completions", b'{"model": "sim-8b", "prompt": [1, "a"]}', 400, None),
        ("/v1/completions", b'{"model": "sim-8b", "prompt": [true]}', 400, None),
        ("/v1/completions", b'{"model": "sim-8b", "prompt": "hi", "max_tokens": "3"}', 400, None),
        ("/v1/completions", b'{"model": "sim-8b", "prompt": "hi", "max_tokens": 1.5}', 400, None),
        ("/v1/completions", b'{"model": "sim-8b", "prompt": "hi", "stream_options": 1}', 400, None),
        ("/v1/chat/completions", b'{"model": "sim-8b", "messages": "hi"}', 400, None),
        (
            "/v1/chat/completions",
            b'{"model": "sim-8b", "messages": [{"role": "user", "content": 5}]}',
            400,
            None,
        ),
    ],
    ids=[
        "nested-100k",
        "nested-unterminated",
        "invalid-utf8",
        "bom",
        "model-int",
        "prompt-int",
        "prompt-mixed-list",
        "prompt-bool-ids",
        "max-tokens-str",
        "max-tokens-float",
        "stream-options-int",
        "messages-str",
        "content-int",
    ],
)
async def test_hostile_bodies_are_openai_4xx(
    client: httpx.AsyncClient, path: str, content: bytes, status: int, code: str | None
) -> None:
    response = await client.post(path, content=content)
    error = assert_openai_error(response, status)
    if code is not None:
        assert error["code"] == code
    # the coordinator still serves
    ok = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}
    )
    assert ok.status_code == 200, ok.text


async def test_nesting_just_under_the_guard_never_gives_5xx(client: httpx.AsyncClient) -> None:
    # decodes in the coordinator; whatever the depth, the answer is a 2xx or an OpenAI 4xx
    for depth in (100, 900, 980, 995, 999):
        response = await client.post("/v1/completions", content=_nested(depth))
        assert response.status_code < 500, (depth, response.status_code, response.text[:200])
        if response.status_code != 200:
            assert_openai_error(response, response.status_code)


async def test_body_over_the_limit_while_streaming_in_is_413() -> None:
    # no Content-Length (chunked): the limit is checked while reading
    limits = CoordinatorLimits(max_body_bytes=4096, max_concurrent_requests=None)
    async with (
        run_coordinator(fleet(), limits=limits) as pd,
        http_client(base_url=pd.url, timeout=30.0) as client,
    ):

        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"model": "sim-8b", "prompt": "'
            for _ in range(10):
                yield b"x" * 1000
            yield b'"}'

        response = await client.post("/v1/completions", content=chunks())
        error = assert_openai_error(response, 413)
        assert error["code"] == "request_too_large"
