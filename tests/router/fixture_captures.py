"""Readers for the real vLLM KV-event captures in ``tests/fixtures/vllm/``."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cbor2

from tests.data import VLLM_FIXTURES

FIXTURES = VLLM_FIXTURES
CAPTURES = (
    "kv_events_samples",
    "kv_events_samples_evict",
    "kv_events_pd_prefill",
    "kv_events_pd_decode",
)
BLOCK_SIZE = 32


@dataclass(frozen=True)
class Capture:
    """One captured message: its three frames and vLLM's decoded form (from the .jsonl)."""

    frames: list[bytes]
    topic: str
    seq: int
    decoded: list[Any]


def read_bin(path: Path) -> list[list[bytes]]:
    """The .bin container: per message u32 BE n_frames, then per frame u32 BE length + bytes."""
    data = path.read_bytes()
    pos = 0
    messages: list[list[bytes]] = []
    while pos < len(data):
        n = int.from_bytes(data[pos : pos + 4], "big")
        pos += 4
        frames = []
        for _ in range(n):
            length = int.from_bytes(data[pos : pos + 4], "big")
            pos += 4
            frames.append(data[pos : pos + length])
            pos += length
        messages.append(frames)
    return messages


def read_capture(name: str) -> list[Capture]:
    lines = (FIXTURES / f"{name}.jsonl").read_text().splitlines()
    frames = read_bin(FIXTURES / f"{name}.bin")
    assert len(frames) == len(lines), name
    out = []
    for message, line in zip(frames, lines, strict=True):
        row = json.loads(line)
        assert message[2] == bytes.fromhex(row["payload_hex"])
        out.append(Capture(message, row["topic"], row["seq"], row["decoded"]))
    return out


NONE_HASH = hashlib.sha256(cbor2.dumps("vllm-none-hash", canonical=True)).digest()


def sha256_cbor_block(
    parent: bytes | None, tokens: list[int], extra: tuple[Any, ...] | None
) -> bytes:
    """vLLM's ``sha256_cbor`` block hash: sha256(cbor((parent or NONE_HASH, tokens, extra)))."""
    payload = cbor2.dumps((parent or NONE_HASH, tuple(tokens), extra), canonical=True)
    return hashlib.sha256(payload).digest()
