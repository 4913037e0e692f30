"""Helpers for the tests that scale a live fleet (test_scaling, test_recall)."""

from __future__ import annotations

from typing import Any

import httpx

from pdorch.app.scaling import ScalingControl
from pdorch.app.server import RunningCoordinator
from tests.coordinator.helpers import MODEL, long_prompt, sse_events


def scaling_of(pd: RunningCoordinator) -> ScalingControl:
    scaling = pd.coordinator.scaling
    assert isinstance(scaling, ScalingControl)
    return scaling


async def stream_long(client: httpx.AsyncClient, max_tokens: int) -> dict[str, Any]:
    """One streamed completion of a long prompt: status, ids, the replicas, the SSE events."""
    body = {"model": MODEL, "prompt": long_prompt(), "max_tokens": max_tokens, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as response:
        raw = await response.aread()
    events = sse_events(raw.decode())
    return {
        "status": response.status_code,
        "id": response.headers.get("x-request-id"),
        "decode": response.headers.get("x-pdorch-decode"),
        "prefill": response.headers.get("x-pdorch-prefill"),
        "events": events,
    }


def stream_ok(result: dict[str, Any], max_tokens: int) -> bool:
    """The stream ended whole: 200, no error event, every token, `[DONE]`."""
    events = result["events"]
    tokens = [e for e in events if isinstance(e, dict) and "choices" in e]
    errors = [e for e in events if isinstance(e, dict) and "error" in e]
    return (
        result["status"] == 200
        and events[-1:] == ["[DONE]"]
        and not errors
        and len(tokens) >= max_tokens
        and tokens[-1]["choices"][0].get("finish_reason") == "length"
    )
