"""The wire format of token-load sharing: one msgspec (msgpack, array-like) message per send.

ZMQ multipart `[TOPIC, payload]`; payload = `SyncMessage`:

    [sender, incarnation, seq, kind, high_water, [[request_id, replica_id, version, removed,
                                                   prefill_tokens, decode_blocks], ...]]

- `sender` is the origin of every entry in the message (a coordinator only sends its own
  requests' entries); `incarnation` changes on every start, so a restarted peer's old entries
  are dropped; `seq` counts messages per incarnation (gaps are counted, repaired by snapshots).
- `kind`: `delta` (changed entries), `snapshot` (every live entry: an entry of the sender that
  is missing and whose version is at most `high_water` is gone), `heartbeat` (no entries),
  `bye` (the sender stops: drop its entries now).
- `high_water`: the highest version the sender has sent.
- Times are not sent: the receiver stamps entries with its own clock, so coordinators on
  different hosts need no common monotonic clock.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

TOPIC = b"pdorch.token_load.v1"

MessageKind = Literal["delta", "snapshot", "heartbeat", "bye"]
_NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class WireEntry(msgspec.Struct, array_like=True, frozen=True):
    """One entry's absolute state (a `TokenLoadDelta` without origin and time)."""

    request_id: str
    replica_id: str
    version: _NonNegative
    removed: bool = False
    prefill_tokens: _NonNegative = 0
    decode_blocks: _NonNegative = 0


class SyncMessage(msgspec.Struct, array_like=True, frozen=True):
    sender: str
    incarnation: str
    seq: _NonNegative
    kind: MessageKind
    high_water: _NonNegative
    entries: list[WireEntry] = []


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(SyncMessage)


def encode_message(message: SyncMessage) -> bytes:
    return _encoder.encode(message)


def decode_message(payload: bytes) -> SyncMessage:
    """Raises `msgspec.DecodeError`/`msgspec.ValidationError` on a bad payload."""
    return _decoder.decode(payload)
