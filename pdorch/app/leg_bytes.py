"""The decode legs' body bytes, spliced into the client's raw JSON where that is exact.

A decode leg's body is the client's body plus fields (`kv_transfer_params` of the prefill,
`return_token_ids: true` when the stream may migrate, `migration.py`). Decoding the client's
JSON is needed anyway (validation, routing); encoding it again per leg is not: when
`ParsedRequest.raw` is set (the body reached us as a plain JSON object that validation left
unchanged, `openai_schema.parse_request`) and no added field is in it already, the leg is
the raw bytes with `,"field":value` inserted before the closing brace. That is the same JSON
document a re-encode would give (same keys and values; key order and the client's spacing
kept), and it costs a slice and a join instead of a walk over the whole body (prompts and
messages of any size). Otherwise (a batch's per-prompt bodies, a field to overwrite) the
body is encoded, the params still as their bytes (`msgspec.Raw`).

The params are the prefill engine's JSON object as it sent it (checked by
`transfer.KvTransferParams.parse` in `legs.prefill_leg`), the same keys `wire()` of the
parsed model emits (`exclude_unset`), without a pydantic dump per request.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pdorch.app.openai_schema import ParsedRequest

_encode = msgspec.json.Encoder().encode
_TOKEN_IDS_FIELD = b'"return_token_ids":true'


def splice(raw: bytes, fields: bytes) -> bytes | None:
    """`raw` (a non-empty JSON object) with `fields` (`"k":v,...`) added before its closing
    brace; None when `raw` does not end with `}` (then re-encode)."""
    end = raw.rfind(b"}")
    if end < 0 or raw[end + 1 :].strip():
        return None
    return b"".join((raw[:end], b",", fields, raw[end:]))


def decode_leg_bytes(parsed: ParsedRequest, base: dict[str, Any], kv_params: bytes | None) -> bytes:
    """The decode leg's body: `base` (the client's body, or it with `return_token_ids`) plus
    `kv_params` (the prefill's `kv_transfer_params` as JSON, `legs.prefill_leg`) when given;
    spliced into `parsed.raw` when exact (module docstring)."""
    raw = parsed.raw
    if raw is not None and (base is parsed.body or "return_token_ids" not in parsed.body):
        fields: list[bytes] = []
        if base is not parsed.body:
            fields.append(_TOKEN_IDS_FIELD)
        if kv_params is not None:
            fields.append(b'"kv_transfer_params":' + kv_params)
        if not fields:
            return raw
        spliced = splice(raw, b",".join(fields))
        if spliced is not None:
            return spliced
    if kv_params is None:
        return _encode(base)
    return _encode({**base, "kv_transfer_params": msgspec.Raw(kv_params)})
