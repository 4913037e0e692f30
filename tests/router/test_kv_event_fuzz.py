"""Fuzzing the KV-event ingestion (issue 14 item 3): vLLM's msgpack wire format, hostile.

Engines are trusted less than the code: a buggy, newer or compromised engine (or anything
that reaches the ZMQ port) can publish any bytes. Two properties, with hypothesis:

- `KvEventDecoder.decode` / `decode_frames` on arbitrary bytes either decode or raise
  `KvEventDecodeError`, never another exception;
- `KvEventSubscriber.on_frames` on arbitrary frames and on structurally valid but wrong
  events (wrong field types, unknown types, token ids that do not fill the blocks, hashes of
  the wrong kind, negative sizes) never raises; what does not decode is counted as garbage
  (`metrics()["garbage"]`), and the index still serves a good event afterwards.

`max_examples` keeps the normal tier fast (a few seconds); `PDORCH_FUZZ=1` runs
the long campaign (see benchmarks/results/reliability.md, "Fuzzing").
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.kv_event_subscriber import EngineEventSource, KvEventSubscriber
from router.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    KvEventDecodeError,
    KvEventDecoder,
    decode_frames,
    encode_frames,
)
from router.kv_index import KvIndex

BS = 4
TOPIC = "kv-events"
# per test, not a global profile: several fuzz modules share one session
fuzz = settings(
    max_examples=2_000 if os.environ.get("PDORCH_FUZZ") else 100,
    deadline=None,
    database=None,  # no .hypothesis/ in the tree; a failure prints its example
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_encode = msgspec.msgpack.Encoder().encode
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.binary(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
# fields of vLLM's events, each a right-typed value or anything at all
ints = st.lists(st.integers(min_value=-5, max_value=2**64 - 1), max_size=12)
hashes = st.lists(
    st.integers(min_value=0, max_value=2**64 - 1) | st.binary(max_size=32), max_size=6
)
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "block_hashes": hashes | values,
    "parent_block_hash": st.none() | st.integers(min_value=0, max_value=2**64 - 1) | values,
    "token_ids": ints | values,
    "block_size": st.integers(min_value=-2, max_value=64) | values,
    "lora_id": st.none() | st.integers(min_value=-1, max_value=2**63) | values,
    "medium": st.sampled_from(["GPU", "CPU", None]) | values,
    "lora_name": st.none() | st.text(max_size=4),
    "extra_keys": st.none()
    | st.lists(st.none() | st.lists(values, max_size=2), max_size=4)
    | values,
    "group_idx": st.none() | st.integers(min_value=-1, max_value=4),
    "zz_unknown": values,
}
event_types = st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Nope"]) | values


@st.composite
def events(draw: st.DrawFn) -> dict[str, Any]:
    fields = draw(st.lists(st.sampled_from(sorted(FIELD_VALUES)), unique=True, max_size=6))
    event: dict[str, Any] = {"type": draw(event_types)}
    for name in fields:
        event[name] = draw(FIELD_VALUES[name])
    return event


payloads = st.one_of(
    st.binary(max_size=64),  # garbage
    st.builds(  # the envelope [ts, [events], dp_rank] with wrong parts
        lambda ts, evs, rank: _encode([ts, evs, rank]),
        st.floats() | values,
        st.lists(events(), max_size=4) | values,
        st.none() | st.integers(min_value=-(2**63), max_value=2**63) | values,
    ),
    st.builds(lambda v: _encode(v), values),
)


@fuzz
@given(st.binary(max_size=256))
def test_decoder_never_raises_another_exception_on_bytes(payload: bytes) -> None:
    try:
        batch = KvEventDecoder().decode(payload)
    except KvEventDecodeError:
        return
    assert isinstance(batch, KvEventBatch)


@fuzz
@given(payloads)
def test_decoder_never_raises_another_exception_on_wrong_events(payload: bytes) -> None:
    with contextlib.suppress(KvEventDecodeError):
        KvEventDecoder().decode(payload)


@fuzz
@given(st.lists(st.binary(max_size=16), max_size=4))
def test_decode_frames_never_raises_another_exception(frames: list[bytes]) -> None:
    with contextlib.suppress(KvEventDecodeError):
        decode_frames(frames)


def _subscriber() -> tuple[KvEventSubscriber, KvIndex]:
    index = KvIndex("m", BS)
    sub = KvEventSubscriber(index)  # not started: on_frames is driven directly, no sockets
    sub.add_engine(EngineEventSource("e1", topic=TOPIC))
    return sub, index


def _good(seq: int, first: int) -> list[bytes]:
    tokens = list(range(first, first + 2 * BS))
    event = BlockStored(block_hashes=[first, first + 1], token_ids=tokens, block_size=BS)
    return encode_frames(TOPIC, seq, KvEventBatch(ts=0.0, events=[event]))


@fuzz
@given(st.lists(payloads, min_size=1, max_size=8))
def test_subscriber_counts_wrong_payloads_and_keeps_serving(batch: list[bytes]) -> None:
    sub, index = _subscriber()
    decoder = KvEventDecoder()
    bad = 0
    for seq, payload in enumerate(batch):
        try:
            decoder.decode(payload)
        except KvEventDecodeError:
            bad += 1
        sub.on_frames([TOPIC.encode(), seq.to_bytes(8, "big"), payload])
    assert sub.metrics()["garbage"] == bad
    sub.on_frames(_good(len(batch), 10_000))
    keys = index.keys_for(list(range(10_000, 10_000 + 2 * BS)))
    assert index.match(keys).get("e1", 0) >= 1


@fuzz
@given(st.lists(st.lists(st.binary(max_size=12), max_size=5), max_size=8))
def test_subscriber_never_raises_on_arbitrary_frames(messages: list[list[bytes]]) -> None:
    sub, _ = _subscriber()
    for frames in messages:
        sub.on_frames(frames)
        sub.on_frames(frames, replica_id="e1")
    sub.on_frames(_good(0, 1))


stored = st.builds(
    BlockStored,
    block_hashes=hashes,
    parent_block_hash=st.none() | st.integers(min_value=0, max_value=2**64 - 1),
    token_ids=st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=12),  # any count
    block_size=st.integers(min_value=-2, max_value=64),
    medium=st.sampled_from(["GPU", "CPU", None]),
    lora_name=st.none() | st.text(max_size=4),
    group_idx=st.none() | st.integers(min_value=-1, max_value=4),
)
removed = st.builds(BlockRemoved, block_hashes=hashes, medium=st.sampled_from(["GPU", None]))
decodable = st.lists(st.one_of(stored, removed, st.just(AllBlocksCleared())), max_size=5)


@fuzz
@given(st.lists(decodable, min_size=1, max_size=6))
def test_decodable_but_wrong_events_never_raise(batches: list[list[Any]]) -> None:
    # what the decoder accepts reaches the index: mismatched sizes must not break it
    sub, index = _subscriber()
    for seq, evs in enumerate(batches):
        sub.on_frames(encode_frames(TOPIC, seq, KvEventBatch(ts=0.0, events=evs)))
    assert sub.metrics()["garbage"] == 0
    sub.on_frames(_good(len(batches), 10_000))
    keys = index.keys_for(list(range(10_000, 10_000 + 2 * BS)))
    assert index.match(keys).get("e1", 0) >= 1


def test_token_ids_outside_uint32_are_malformed() -> None:
    # found by the fuzzer: token id -1 raised OverflowError out of the index's block keys
    sub, index = _subscriber()
    for seq, bad in enumerate(([0, 0, 0, -1], [0, 0, 0, 2**32])):
        event = BlockStored(block_hashes=[7], token_ids=bad, block_size=BS)
        sub.on_frames(encode_frames(TOPIC, seq, KvEventBatch(ts=0.0, events=[event])))
    assert sub.metrics()["garbage"] == 2
    assert index.blocks("e1") == 0
