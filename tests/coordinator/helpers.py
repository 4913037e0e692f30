"""Helpers for the coordinator tests: sim fleet configs, SSE parsing, engine metrics."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import httpx

from pdorch.config.fleet import FleetConfig, parse_fleet_config

MODEL = "sim-8b"
# `coordinator.leg_client` values: tests of the legs' failure paths run on both clients
LEG_CLIENTS = ("aiohttp", "native")
EXTERNAL = re.compile(
    r'^vllm:prompt_tokens_by_source_total\{[^}]*source="external_kv_transfer"[^}]*\}\s+(\S+)',
    re.MULTILINE,
)
RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\}\s+(\S+)", re.MULTILINE)


def sim(count: int = 1, **overrides: Any) -> dict[str, Any]:
    """A simulated-engine launch spec (8B on H100, 100x faster than real time)."""
    spec: dict[str, Any] = {
        "kind": "sim",
        "count": count,
        "model_profile": "llama-3.1-8b",
        "gpu": "h100",
        "time_scale": 0.01,
        "kv_transport": "tcp",
    }
    spec.update(overrides)
    return spec


def fleet(
    prefill: list[dict[str, Any]] | None = None,
    decode: list[dict[str, Any]] | None = None,
    **sections: Any,
) -> FleetConfig:
    """A fleet config (defaults: 1 prefill + 1 decode sim, disaggregate from 32 tokens)."""
    data: dict[str, Any] = {
        "served_model_name": MODEL,
        "block_size": 16,
        "pools": {
            "prefill": {"launch": prefill if prefill is not None else [sim()]},
            "decode": {"launch": decode if decode is not None else [sim()]},
        },
        "pd": {"min_uncached_tokens": 32},
        "coordinator": {"port": 0},
        # a shared 2-core box can be slow to answer a probe; a dead engine still refuses at once
        "health": {"timeout_s": 2.0},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return parse_fleet_config(data)


def long_prompt(words: int = 120) -> str:
    """A prompt no cache holds yet (a uuid first), long enough to be disaggregated."""
    return f"{uuid.uuid4().hex} " + " ".join(f"word{i}" for i in range(words))


def sse_events(text: str) -> list[Any]:
    """The `data:` payloads of an SSE body ("[DONE]" kept as the string)."""
    events: list[Any] = []
    for block in text.split("\n\n"):
        block = block.strip()
        if not block.startswith("data: "):
            continue
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def stream_text(events: list[Any], chat: bool) -> str:
    out = []
    for event in events:
        if not isinstance(event, dict) or "choices" not in event:
            continue
        for choice in event["choices"]:
            if chat:
                out.append(choice.get("delta", {}).get("content") or "")
            else:
                out.append(choice.get("text") or "")
    return "".join(out)


def answer_text(body: dict[str, Any], chat: bool) -> str:
    choice = body["choices"][0]
    return str(choice["message"]["content"] if chat else choice["text"])


async def engine_metric(client: httpx.AsyncClient, url: str, pattern: re.Pattern[str]) -> float:
    text = (await client.get(f"{url}/metrics")).text
    return sum(float(v) for v in pattern.findall(text))


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert "code" in error
    return dict(error)
