"""Steady closed-loop load for a chaos scenario: `concurrency` workers, half streaming.

Worker i sends streaming completions when i is even, non-streaming ones when odd, one after
the other until `stop` is set; every prompt is unique (a uuid first, then ~`prompt_words`
words, long enough to be disaggregated). Streamed requests go through the live harness's
client (`benchmarks.live.client.stream_request`: TTFT, gaps, `[DONE]`, error events);
non-streamed ones through `whole_request` below, filling the same `RequestResult` (its TTFT is
the whole answer's latency: a non-streamed answer's first byte is its last).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from benchmarks.live.client import RequestResult, stream_request
from pools.http_client import client_limits, http_client


@dataclass(frozen=True, slots=True)
class LoadSettings:
    concurrency: int = 32
    max_tokens: int = 128
    prompt_words: int = 80
    request_timeout_s: float = 120.0


def payload(model: str, settings: LoadSettings, stream: bool) -> dict[str, Any]:
    words = " ".join(f"w{i}" for i in range(settings.prompt_words))
    body: dict[str, Any] = {
        "model": model,
        "prompt": f"{uuid.uuid4().hex} {words}",
        "max_tokens": settings.max_tokens,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def whole_request(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    result: RequestResult,
    *,
    clock_origin: float,
    timeout_s: float,
) -> RequestResult:
    """One non-streamed completion; an error is any non-200 or transport failure."""
    started = time.perf_counter()
    result.start_s = started - clock_origin
    try:
        async with asyncio.timeout(timeout_s):
            response = await client.post(url, json=body)
        if response.status_code != 200:
            result.error = f"HTTP {response.status_code}: {response.text[:300]}"
        else:
            result.ttft_s = time.perf_counter() - started
            usage = response.json().get("usage") or {}
            result.output_tokens = int(usage.get("completion_tokens") or 0)
    except TimeoutError:
        result.error = f"timed out after {timeout_s:g}s"
    except (httpx.HTTPError, ValueError, OSError) as err:
        result.error = f"{type(err).__name__}: {err}"
    finally:
        result.end_s = time.perf_counter() - clock_origin
    return result


async def run_load(
    base_url: str,
    model: str,
    settings: LoadSettings,
    stop: asyncio.Event,
    clock_origin: float,
    on_done: Callable[[RequestResult], None] | None = None,
    *,
    backoff_s: float = 0.0,
    headers: dict[str, str] | None = None,
) -> list[RequestResult]:
    """Drive the load until `stop`; every request started is awaited (none is cancelled).
    `backoff_s` > 0: a worker whose request failed before its first byte waits that long before
    the next (a client retrying a refused connection; without it a coordinator that is down
    turns each worker into a busy loop of refusals). `headers`: sent with every request (e.g.
    `x-pdorch-priority`)."""
    results: list[RequestResult] = []
    url = base_url + "/v1/completions"

    async def worker(index: int, client: httpx.AsyncClient) -> None:
        stream = index % 2 == 0
        turn = 0
        while not stop.is_set():
            result = RequestResult(
                session_id=f"w{index}", turn=turn, group="stream" if stream else "whole", start_s=0
            )
            body = payload(model, settings, stream)
            if stream:
                await stream_request(
                    client,
                    url,
                    body,
                    result,
                    clock_origin=clock_origin,
                    timeout_s=settings.request_timeout_s,
                )
            else:
                await whole_request(
                    client,
                    url,
                    body,
                    result,
                    clock_origin=clock_origin,
                    timeout_s=settings.request_timeout_s,
                )
            results.append(result)
            if on_done is not None:
                on_done(result)
            turn += 1
            if backoff_s > 0 and result.error is not None and result.ttft_s is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff_s)

    limits = client_limits(
        max_connections=settings.concurrency + 8, max_keepalive_connections=settings.concurrency
    )
    async with http_client(
        timeout=settings.request_timeout_s, limits=limits, headers=headers
    ) as client:
        await asyncio.gather(*(worker(i, client) for i in range(settings.concurrency)))
    return results
