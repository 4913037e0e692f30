"""Which replica has which LoRA adapter (pure state): polls replace, KV events add."""

from __future__ import annotations

import pytest

from pdorch.app.adapters import AdapterInfo, ReplicaAdapters, adapters_of_models_list
from pdorch.app.models import peek_model

VLLM_MODELS = {
    "object": "list",
    "data": [
        {"id": "tiny", "object": "model", "root": "/models/tiny", "parent": None},
        {"id": "sql", "object": "model", "root": "/adapters/sql", "parent": "tiny"},
    ],
}


def test_models_list_cards_with_a_parent_are_adapters() -> None:
    assert adapters_of_models_list(VLLM_MODELS) == [AdapterInfo("sql", "tiny", "/adapters/sql")]
    with pytest.raises(ValueError):
        adapters_of_models_list({"error": "nope"})


def test_a_poll_replaces_what_events_added_and_removal_forgets() -> None:
    state = ReplicaAdapters()
    state.set_listed("d-0", adapters_of_models_list(VLLM_MODELS))
    state.saw("d-1", "chat")  # a BlockStored with lora_name=chat
    assert state.holders("sql") == {"d-0"} and state.holders("chat") == {"d-1"}
    assert [a.name for a in state.known("tiny")] == ["chat", "sql"]
    assert state.known("tiny")[0].parent == "tiny"  # seen only in events: the base is its parent
    state.set_listed("d-1", [])  # d-1's /v1/models lists no adapter: chat was unloaded
    assert state.holders("chat") == frozenset()
    state.saw("d-0", "chat")
    assert state.loaded("d-0") == {"sql", "chat"}
    state.remove("d-0")
    assert state.holders("sql") == frozenset() and state.known("tiny") == []


@pytest.mark.parametrize(
    ("raw", "model"),
    [
        (b'{"prompt": "x", "model": "a", "n": 1}', "a"),
        (b'{"prompt": "x"}', None),
        (b'{"model": 3}', None),
        (b"[1, 2]", None),
        (b"not json", None),
    ],
)
def test_peek_model_reads_only_a_string_model(raw: bytes, model: str | None) -> None:
    assert peek_model(raw) == model
