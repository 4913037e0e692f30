"""The simulated engine's KV-event publisher speaks vLLM's wire: bytes, sockets, replay."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
import zmq
import zmq.asyncio

from pools.sim.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from pools.sim.kv_publisher import (
    END_SEQ,
    ZmqKvEventPublisher,
    encode_event_batch,
    is_bind_endpoint,
)
from tests.data import VLLM_FIXTURES
from tests.ports import free_port

FIXTURES = VLLM_FIXTURES
CAPTURES = (
    "kv_events_samples",
    "kv_events_samples_evict",
    "kv_events_pd_prefill",
    "kv_events_pd_decode",
)

Batch = tuple[float, list[KVCacheEvent], int]


def _frames() -> list[tuple[str, int, bytes]]:
    out = []
    for name in CAPTURES:
        for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines():
            msg = json.loads(line)
            out.append((msg["topic"], msg["seq"], bytes.fromhex(msg["payload_hex"])))
    return out


def test_every_captured_vllm_payload_reencodes_byte_for_byte() -> None:
    frames = _frames()
    assert len(frames) > 100
    for _, _, payload in frames:
        ts, events, rank = msgspec.msgpack.decode(payload, type=Batch)
        assert encode_event_batch(ts, events, rank) == payload


def test_events_are_maps_with_type_first() -> None:
    stored = BlockStored(
        block_hashes=[1, 2],
        parent_block_hash=None,
        token_ids=list(range(64)),
        block_size=32,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=[None, None],
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    )
    payload = encode_event_batch(12.5, [stored, BlockRemoved([2], "GPU", 0), AllBlocksCleared()])
    ts, events, rank = msgspec.msgpack.decode(payload)
    assert (ts, rank) == (12.5, 0)
    assert [next(iter(e)) for e in events] == ["type", "type", "type"]
    assert [e["type"] for e in events] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    assert list(events[0])[1:5] == ["block_hashes", "parent_block_hash", "token_ids", "block_size"]


@pytest.mark.parametrize(
    ("endpoint", "binds"),
    [
        ("tcp://*:5557", True),
        ("tcp://[::]:5557", True),
        ("ipc:///tmp/x", True),
        ("inproc://x", True),
        ("tcp://127.0.0.1:5557", False),
        ("tcp://localhost:5557", False),
    ],
)
def test_bind_connect_rule(endpoint: str, binds: bool) -> None:
    assert is_bind_endpoint(endpoint) is binds


@pytest.mark.integration
async def test_publisher_connects_to_a_binding_subscriber_and_replays(tmp_path: Path) -> None:
    """tcp://127.0.0.1:P is connected (the subscriber binds); replay is a bound ROUTER."""
    ctx = zmq.asyncio.Context()
    port = free_port()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(f"tcp://127.0.0.1:{port}")
    replay_endpoint = f"ipc://{tmp_path}/replay"
    pub = ZmqKvEventPublisher(f"tcp://127.0.0.1:{port}", replay_endpoint, buffer_steps=3)
    pub.start()
    dealer = ctx.socket(zmq.DEALER)
    try:
        # slow-joiner: publish until the first message arrives, then count from there
        first: list[bytes] | None = None
        for _ in range(200):
            pub.publish([AllBlocksCleared()], ts=1.0)
            if await sub.poll(20):
                first = await sub.recv_multipart()
                break
        assert first is not None, "subscriber never received a message"
        topic, seq, payload = first
        assert topic == b"kv-events"
        assert len(seq) == 8
        assert msgspec.msgpack.decode(payload) == [1.0, [{"type": "AllBlocksCleared"}], 0]
        start = pub.next_seq
        for i in range(4):
            pub.publish([BlockRemoved([i], "GPU", 0)], ts=2.0 + i)
        received = [
            await sub.recv_multipart() for _ in range(start - int.from_bytes(seq, "big") - 1 + 4)
        ]
        assert [int.from_bytes(m[1], "big") for m in received[-4:]] == list(range(start, start + 4))

        # replay: only the last 3 batches are buffered; ask from start+1
        dealer.connect(replay_endpoint)
        await dealer.send_multipart([b"", (start + 1).to_bytes(8, "big")])
        replies = []
        while True:
            frames = await dealer.recv_multipart()
            replies.append(frames)
            if frames[2] == END_SEQ:
                break
        assert [int.from_bytes(f[2], "big") for f in replies[:-1]] == [
            start + 1,
            start + 2,
            start + 3,
        ]
        assert all(f[0] == b"" and f[1] == b"kv-events" for f in replies[:-1])
        assert replies[-1] == [b"", b"", END_SEQ, b""]
        decoded = msgspec.msgpack.decode(replies[0][3])
        assert decoded[1] == [
            {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "group_idx": 0}
        ]
    finally:
        await pub.close()
        dealer.close(0)
        sub.close(0)
        ctx.term()


@pytest.mark.integration
async def test_ipc_endpoint_binds(tmp_path: Path) -> None:
    ctx = zmq.asyncio.Context()
    endpoint = f"ipc://{tmp_path}/events"
    pub = ZmqKvEventPublisher(endpoint)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    try:
        got = None
        for _ in range(200):
            pub.publish([AllBlocksCleared()])
            if await sub.poll(20):
                got = await sub.recv_multipart()
                break
        assert got is not None and got[0] == b"kv-events"
    finally:
        await pub.close()
        sub.close(0)
        ctx.term()
