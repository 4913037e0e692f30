"""vLLM's KV-cache events, decoded with msgspec (the wire format engines publish over ZMQ).

Wire format (vLLM ``ZmqEventPublisher``, see ``tests/fixtures/vllm/README.md``):

* a ZMQ multipart message of 3 frames: ``topic`` (UTF-8, may be empty), ``seq`` (8-byte
  big-endian unsigned, counting from 0 per publisher; back to 0 when the engine restarts),
  ``payload`` (msgpack);
* ``payload = [ts, [event, ...], data_parallel_rank]`` -- an *array*, not a map;
* each event is a msgpack *map* whose ``"type"`` key names the event (``"BlockStored"``,
  ``"BlockRemoved"``, ``"AllBlocksCleared"``); fields equal to their default may be omitted and
  unknown fields (newer vLLM versions add some) are ignored.

Public API (stable; D2 and the coordinator use it):

* :class:`BlockStored`, :class:`BlockRemoved`, :class:`AllBlocksCleared` -- the events;
  ``KvEvent`` is their union; :class:`KvEventBatch` is one payload.
* :func:`decode_event_batch` -- ``bytes -> KvEventBatch``; fast path is one msgspec decode of the
  whole payload; if that fails only because some event has an unknown ``type`` (a newer engine),
  the known events are kept and the unknown ones dropped (counted by the decoder). Anything
  else raises :class:`KvEventDecodeError`.
* :func:`decode_frames` -- ``[topic, seq, payload] -> KvEventMessage`` (validates frame count
  and the 8-byte seq).
* :func:`encode_event_batch` / :func:`encode_frames` -- the inverse, for simulated engines,
  tests and benchmarks (vLLM's own decoder reads them: same envelope, ``type`` first, every
  field written). Decoding is more lenient than encoding: omitted fields take their defaults.
* :data:`END_OF_REPLAY_SEQ` -- the replay socket's end marker (seq = -1, i.e. ``0xff`` x 8).

Block hashes are ``int`` (vLLM publishes the low 64 bits of the block digest when
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` is on, the default) or ``bytes`` (the full digest when
it is off); consumers treat them as opaque keys (:data:`EngineBlockHash`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, TypeAlias

import msgspec

EngineBlockHash: TypeAlias = int | bytes
"""A block hash as the engine publishes it: opaque, only compared for equality."""

END_OF_REPLAY_SEQ: bytes = b"\xff" * 8
"""The seq frame the replay socket sends last (``-1`` as 8-byte big-endian signed)."""


TokenId: TypeAlias = Annotated[int, msgspec.Meta(ge=0, lt=2**32)]
"""A token id as block keys pack it (uint32). Checked by msgspec while decoding (in C): an
event with a negative or wider id is malformed (the fuzzer found one raising `OverflowError`
out of the index, past the garbage counter)."""


class KvEventDecodeError(ValueError):
    """A frame or payload is not a vLLM KV-event message (garbage, truncated, wrong shape)."""


class BlockStored(msgspec.Struct, tag=True, gc=False):
    """Full blocks entered the engine's prefix cache.

    ``block_hashes[i]`` covers ``token_ids[i*block_size:(i+1)*block_size]``; the first block's
    parent is ``parent_block_hash`` (None: the chain starts at the beginning of a prompt).
    ``extra_keys`` has one entry per block, *untagged* (vLLM's event form): the LoRA name first
    when ``lora_name`` is set, multimodal ``[identifier, offset]`` pairs, the ``cache_salt``
    string (first block of a prompt only) and prompt-embeds digests (bytes).
    """

    block_hashes: list[EngineBlockHash]
    parent_block_hash: EngineBlockHash | None = None
    token_ids: list[TokenId] = []
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[list[Any] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, gc=False):
    """Blocks left the engine's prefix cache (evicted or freed for reuse)."""

    block_hashes: list[EngineBlockHash]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """The engine dropped its whole prefix cache (``reset_prefix_cache``); sent at its next step."""


KvEvent: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared


class KvEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One payload: ``[ts, [event, ...], data_parallel_rank]``."""

    ts: float
    events: list[KvEvent]
    data_parallel_rank: int | None = None


class _LooseBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class _TypeOnly(msgspec.Struct, gc=False):
    type: str


@dataclass(frozen=True, slots=True)
class KvEventMessage:
    """One ZMQ message: the topic, its sequence number and the decoded batch."""

    topic: str
    seq: int
    batch: KvEventBatch


@dataclass(slots=True)
class KvEventDecoder:
    """Reusable decoder; counts events it had to drop because their ``type`` is unknown."""

    unknown_events: int = 0
    _fast: msgspec.msgpack.Decoder[KvEventBatch] = field(
        default_factory=lambda: msgspec.msgpack.Decoder(KvEventBatch)
    )
    _loose: msgspec.msgpack.Decoder[_LooseBatch] = field(
        default_factory=lambda: msgspec.msgpack.Decoder(_LooseBatch)
    )
    _one: msgspec.msgpack.Decoder[KvEvent] = field(
        default_factory=lambda: msgspec.msgpack.Decoder(KvEvent)
    )
    _type: msgspec.msgpack.Decoder[_TypeOnly] = field(
        default_factory=lambda: msgspec.msgpack.Decoder(_TypeOnly)
    )

    def decode(self, payload: bytes) -> KvEventBatch:
        """Decode one payload; raise :class:`KvEventDecodeError` if it is not one."""
        try:
            return self._fast.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        # Slow path: keep the known events of a batch from a newer engine.
        try:
            loose = self._loose.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise KvEventDecodeError(f"not a KV event batch: {exc}") from exc
        events: list[KvEvent] = []
        for raw in loose.events:
            try:
                events.append(self._one.decode(raw))
                continue
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                error = exc
            try:
                kind = self._type.decode(raw).type
            except (msgspec.DecodeError, msgspec.ValidationError):
                raise KvEventDecodeError(f"event without a type: {error}") from error
            if kind in _KNOWN_TYPES:
                raise KvEventDecodeError(f"malformed {kind} event: {error}") from error
            self.unknown_events += 1
        return KvEventBatch(loose.ts, events, loose.data_parallel_rank)

    def decode_frames(self, frames: list[bytes]) -> KvEventMessage:
        """Decode a ``[topic, seq, payload]`` multipart message."""
        if len(frames) != 3:
            raise KvEventDecodeError(f"expected 3 frames, got {len(frames)}")
        topic_b, seq_b, payload = frames
        if len(seq_b) != 8:
            raise KvEventDecodeError(f"seq frame must be 8 bytes, got {len(seq_b)}")
        try:
            topic = bytes(topic_b).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise KvEventDecodeError("topic is not UTF-8") from exc
        return KvEventMessage(topic, int.from_bytes(seq_b, "big"), self.decode(bytes(payload)))


_KNOWN_TYPES = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})
_DEFAULT_DECODER = KvEventDecoder()
_ENCODER = msgspec.msgpack.Encoder()


def decode_event_batch(payload: bytes) -> KvEventBatch:
    """Decode one msgpack payload (see :meth:`KvEventDecoder.decode`)."""
    return _DEFAULT_DECODER.decode(payload)


def decode_frames(frames: list[bytes]) -> KvEventMessage:
    """Decode a ``[topic, seq, payload]`` message (see :meth:`KvEventDecoder.decode_frames`)."""
    return _DEFAULT_DECODER.decode_frames(frames)


def encode_event_batch(batch: KvEventBatch) -> bytes:
    """Encode a batch in vLLM's wire format (array envelope, maps with ``type`` first)."""
    return _ENCODER.encode(batch)


def encode_frames(topic: str, seq: int, batch: KvEventBatch) -> list[bytes]:
    """The three frames vLLM's publisher sends for ``batch`` as message number ``seq``."""
    return [topic.encode("utf-8"), seq.to_bytes(8, "big"), encode_event_batch(batch)]
