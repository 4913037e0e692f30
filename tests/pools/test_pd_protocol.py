"""Leg bodies of the two-leg P/D protocol (pure rewriting; the real legs run in tests/e2e)."""

from __future__ import annotations

import copy

import pytest

from pools.pd_protocol import (
    PREFILL_KV_TRANSFER_PARAMS,
    decode_leg_body,
    kv_transfer_params_of,
    new_request_id,
    prefill_leg_body,
)
from transfer.params import KvTransferParams

CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 64,
    "max_completion_tokens": 64,
    "min_tokens": 4,
    "temperature": 0.0,
}
# a prefill engine's answer, as JSON (a newer vLLM's unknown key included)
WIRE_PARAMS = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[1, 2, 3]],
    "remote_engine_id": "e-1",
    "remote_request_id": "r-1",
    "remote_host": "127.0.0.1",
    "remote_port": 18600,
    "tp_size": 1,
    "future_key": {"nested": [1]},
}
PARAMS = KvTransferParams.parse(WIRE_PARAMS)


def test_prefill_leg_asks_for_one_unstreamed_token_and_keeps_the_kv() -> None:
    original = copy.deepcopy(CHAT)
    leg = prefill_leg_body(CHAT)

    assert original == CHAT  # the client's body is not touched
    assert leg["stream"] is False
    assert leg["max_tokens"] == 1
    assert leg["max_completion_tokens"] == 1
    assert "stream_options" not in leg
    assert "min_tokens" not in leg
    # what vLLM's own P/D proxy sends: the remote fields as explicit nulls
    assert leg["kv_transfer_params"] == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    assert KvTransferParams.parse(leg["kv_transfer_params"]) == PREFILL_KV_TRANSFER_PARAMS
    assert leg["messages"] == CHAT["messages"]
    assert leg["temperature"] == 0.0


def test_prefill_leg_adds_max_completion_tokens_only_when_the_client_used_it() -> None:
    leg = prefill_leg_body({"model": "tiny", "prompt": "hi", "max_tokens": 9})
    assert leg["max_tokens"] == 1
    assert "max_completion_tokens" not in leg


def test_decode_leg_is_the_client_body_plus_the_params_unchanged() -> None:
    leg = decode_leg_body(CHAT, PARAMS)
    assert {k: v for k, v in leg.items() if k != "kv_transfer_params"} == CHAT
    assert leg["kv_transfer_params"] == WIRE_PARAMS  # key for key, the unknown one included
    leg["kv_transfer_params"]["future_key"]["nested"].append(2)
    assert decode_leg_body(CHAT, PARAMS)["kv_transfer_params"] == WIRE_PARAMS  # a fresh copy


def test_kv_transfer_params_must_be_present_and_remote_prefill() -> None:
    assert kv_transfer_params_of({"kv_transfer_params": WIRE_PARAMS}) == PARAMS
    for response in ({}, {"kv_transfer_params": None}, {"kv_transfer_params": {"x": 1}}):
        with pytest.raises(ValueError, match="KV connector"):
            kv_transfer_params_of(response)
    with pytest.raises(ValueError, match="remote_port"):
        kv_transfer_params_of({"kv_transfer_params": {**WIRE_PARAMS, "remote_port": "x"}})


def test_request_ids_are_unique() -> None:
    assert len({new_request_id() for _ in range(100)}) == 100
