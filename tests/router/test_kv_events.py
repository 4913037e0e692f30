"""Decoding real vLLM KV-event captures, and reproducing their sha256_cbor block hashes."""

from __future__ import annotations

import json

import msgspec
import pytest

from router.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KvEventBatch,
    KvEventDecodeError,
    KvEventDecoder,
    decode_event_batch,
    decode_frames,
    encode_event_batch,
    encode_frames,
)
from tests.router.fixture_captures import (
    CAPTURES,
    FIXTURES,
    read_capture,
    sha256_cbor_block,
)


@pytest.mark.parametrize("name", CAPTURES)
def test_every_captured_message_decodes_to_what_vllm_sent(name: str) -> None:
    captures = read_capture(name)
    assert captures
    for cap in captures:
        msg = decode_frames(cap.frames)
        assert msg.topic == cap.topic == "kv-events"
        assert msg.seq == cap.seq
        ts, events, rank = cap.decoded
        assert msg.batch.ts == ts
        assert msg.batch.data_parallel_rank == rank
        assert len(msg.batch.events) == len(events)
        for got, want in zip(msg.batch.events, events, strict=True):
            assert type(got).__name__ == want["type"]
            plain = msgspec.to_builtins(got)
            for key, value in want.items():
                if key == "type" or (key == "kv_cache_spec_kind" and value is None):
                    continue
                assert plain.get(key) == value, (name, cap.seq, key)


def test_hand_picked_fixtures_decode() -> None:
    picked = json.loads((FIXTURES / "kv_events_fixtures.json").read_text())
    kinds: set[type[KvEvent]] = set()
    for item in picked:
        frames = [bytes.fromhex(item["frames"][k]) for k in ("topic_hex", "seq_hex", "payload_hex")]
        msg = decode_frames(frames)
        kinds.update(type(e) for e in msg.batch.events)
        assert len(msg.batch.events) == len(item["decoded"][1])
    assert kinds == {BlockStored, BlockRemoved, AllBlocksCleared}


def test_salted_block_carries_the_salt_untagged_on_its_first_block() -> None:
    salted = [
        e
        for cap in read_capture("kv_events_pd_decode")
        for e in decode_frames(cap.frames).batch.events
        if isinstance(e, BlockStored) and e.extra_keys and e.extra_keys[0]
    ]
    assert salted
    event = salted[0]
    assert event.extra_keys is not None
    assert event.extra_keys[0] == ["ref-no-prefix-hit"]
    assert all(k is None for k in event.extra_keys[1:])


@pytest.mark.parametrize("name", CAPTURES)
def test_sha256_cbor_hashes_of_captured_blocks_reproduce(name: str) -> None:
    """Each BlockStored hash = low 64 bits of sha256(cbor((parent, tokens, extra_keys)))."""
    digests: dict[int, bytes] = {}
    checked = 0
    for cap in read_capture(name):
        for event in decode_frames(cap.frames).batch.events:
            if not isinstance(event, BlockStored):
                continue
            parent = None
            if event.parent_block_hash is not None:
                assert isinstance(event.parent_block_hash, int)
                parent = digests[event.parent_block_hash]
            bs = event.block_size
            for i, engine_hash in enumerate(event.block_hashes):
                extra = event.extra_keys[i] if event.extra_keys else None
                # Events carry extra keys untagged; the hash uses the tagged form. The only
                # extra keys in these captures are cache salts.
                tagged = tuple(("cache_salt", k) for k in extra) if extra else None
                digest = sha256_cbor_block(parent, event.token_ids[i * bs : (i + 1) * bs], tagged)
                assert int.from_bytes(digest, "big") & (2**64 - 1) == engine_hash
                assert isinstance(engine_hash, int)
                digests[engine_hash] = digest
                parent = digest
                checked += 1
    assert checked > 0


def test_prefill_and_decode_publish_the_same_hashes_for_transferred_blocks() -> None:
    def stored(name: str) -> set[int | bytes]:
        return {
            h
            for cap in read_capture(name)
            for e in decode_frames(cap.frames).batch.events
            if isinstance(e, BlockStored)
            for h in e.block_hashes
        }

    assert stored("kv_events_pd_prefill") <= stored("kv_events_pd_decode")


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x00",
        b"not msgpack at all \xc1\xc1",
        msgspec.msgpack.encode({"ts": 1.0}),
        msgspec.msgpack.encode([1.0, "events", 0]),
        msgspec.msgpack.encode([1.0, [{"type": "BlockStored"}], 0]),
        msgspec.msgpack.encode([1.0, [{"block_hashes": [1]}], 0]),
        msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": "x"}], 0]),
        msgspec.msgpack.encode([1.0, [42], 0]),
    ],
)
def test_garbage_payload_raises_a_typed_error(payload: bytes) -> None:
    with pytest.raises(KvEventDecodeError):
        decode_event_batch(payload)


@pytest.mark.parametrize(
    "frames",
    [
        [b"kv-events", b"\x00" * 8],
        [b"kv-events", b"\x00" * 7, b"\x93"],
        [b"\xff\xfe", b"\x00" * 8, msgspec.msgpack.encode([1.0, [], 0])],
        [b"a", b"b", b"c", b"d"],
    ],
)
def test_garbage_frames_raise_a_typed_error(frames: list[bytes]) -> None:
    with pytest.raises(KvEventDecodeError):
        decode_frames(frames)


def test_unknown_event_types_from_a_newer_engine_are_dropped_and_counted() -> None:
    decoder = KvEventDecoder()
    payload = msgspec.msgpack.encode(
        [
            2.0,
            [
                {"type": "BlockPinned", "block_hashes": [1]},
                {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU", "new_field": 3},
                {"type": "AllBlocksCleared"},
            ],
            1,
        ]
    )
    batch = decoder.decode(payload)
    assert batch.events == [BlockRemoved([7], "GPU"), AllBlocksCleared()]
    assert batch.data_parallel_rank == 1
    assert decoder.unknown_events == 1


def test_omitted_default_fields_decode() -> None:
    payload = msgspec.msgpack.encode(
        [1.0, [{"type": "BlockStored", "block_hashes": [5], "token_ids": [1, 2], "block_size": 2}]]
    )
    batch = decode_event_batch(payload)
    assert batch.data_parallel_rank is None
    event = batch.events[0]
    assert isinstance(event, BlockStored)
    assert event.parent_block_hash is None and event.lora_name is None and event.extra_keys is None


@pytest.mark.integration
def test_encoding_roundtrips_and_vllm_reads_it() -> None:
    batch = KvEventBatch(
        3.5,
        [
            BlockStored([11, 12], None, list(range(8)), 4, medium="GPU", extra_keys=[["s"], None]),
            BlockRemoved([11], "GPU"),
            AllBlocksCleared(),
        ],
        0,
    )
    frames = encode_frames("t", 9, batch)
    msg = decode_frames(frames)
    assert (msg.topic, msg.seq, msg.batch) == ("t", 9, batch)
    # The first key of every event map is "type", as vLLM writes it.
    raw = msgspec.msgpack.decode(encode_event_batch(batch))
    assert all(next(iter(event)) == "type" for event in raw[1])
    from vllm.distributed.kv_events import BlockStored as VllmBlockStored
    from vllm.distributed.kv_events import KVEventBatch as VllmBatch

    theirs = msgspec.msgpack.decode(frames[2], type=VllmBatch)
    assert [type(e).__name__ for e in theirs.events] == [
        "BlockStored",
        "BlockRemoved",
        "AllBlocksCleared",
    ]
    first = theirs.events[0]
    assert isinstance(first, VllmBlockStored) and first.token_ids == list(range(8))
