"""Decode leg bodies spliced into the client's raw JSON (`pdorch/app/leg_bytes.py`): the same
document a re-encode gives, and a re-encode whenever splicing would not be exact."""

from __future__ import annotations

import msgspec
import pytest

from pdorch.app.leg_bytes import decode_leg_bytes, splice
from pdorch.app.migration import with_token_ids
from pdorch.app.openai_schema import parse_request
from transfer.params import KvTransferParams

MODEL = "m"
KV = KvTransferParams(
    do_remote_prefill=True,
    remote_engine_id="engine-1",
    remote_block_ids=[[4, 5, 6]],
    remote_host="10.0.0.2",
    remote_port=5600,
)


def _expected(body: dict[str, object], kv: KvTransferParams | None, ids: bool) -> object:
    want = dict(body)
    if ids:
        want["return_token_ids"] = True
    if kv is not None:
        want["kv_transfer_params"] = kv.wire()
    return want


def _wire(kv: KvTransferParams | None) -> bytes | None:
    return None if kv is None else msgspec.json.encode(kv.wire())


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"m","prompt":"hi","max_tokens":4}',
        b' {\n  "model": "m", "prompt": [1, 2, 3], "stream": true }\n',
        b'{"model":"m","messages":[{"role":"user","content":"a}b"}],"stream":true}',
    ],
)
@pytest.mark.parametrize("kv", [KV, None])
@pytest.mark.parametrize("ids", [True, False])
def test_spliced_body_is_the_reencoded_document(
    raw: bytes, kv: KvTransferParams | None, ids: bool
) -> None:
    parsed = parse_request(raw, "chat" if b"messages" in raw else "completion", MODEL)
    assert parsed.raw == raw
    base = with_token_ids(parsed.body) if ids else parsed.body
    out = decode_leg_bytes(parsed, base, _wire(kv))
    assert msgspec.json.decode(out) == _expected(parsed.body, kv, ids)
    if kv is None and not ids:
        assert out is raw  # nothing added: the client's bytes as sent
    else:
        assert out.startswith(raw.rstrip()[:-1])  # the client's bytes, kept as sent


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"m","prompt":"hi","kv_transfer_params":{"do_remote_prefill":true}}',
        b'{"model":"m","prompt":"hi","request_id":"mine"}',
        b'{"model":"m","prompt":["one"]}',  # a batch of one becomes its prompt
        b'{"model":"m","prompt":["one","two"]}',  # a batch: per-prompt bodies
    ],
)
def test_bodies_validation_changed_are_not_spliced(raw: bytes) -> None:
    parsed = parse_request(raw, "completion", MODEL)
    assert parsed.raw is None
    body = parsed.for_prompt("one").body if parsed.batch else parsed.body
    out = decode_leg_bytes(parsed, body, _wire(KV))
    decoded = msgspec.json.decode(out)
    assert decoded["kv_transfer_params"] == KV.wire()
    assert "request_id" not in decoded


def test_a_field_the_client_set_is_overwritten_not_duplicated() -> None:
    raw = b'{"model":"m","prompt":"hi","stream":true,"return_token_ids":false}'
    parsed = parse_request(raw, "completion", MODEL)
    out = decode_leg_bytes(parsed, with_token_ids(parsed.body), None)
    assert out.count(b"return_token_ids") == 1
    assert msgspec.json.decode(out)["return_token_ids"] is True


def test_splice_needs_a_closing_brace() -> None:
    assert splice(b'{"a":1}', b'"b":2') == b'{"a":1,"b":2}'
    assert splice(b'{"a":1} x', b'"b":2') is None
