"""The precise KV index: real captures, removals, clears, duplicates, caps, LoRA and salts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.block_keys import KeySeed, block_keys
from router.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineBlockHash,
    KvEvent,
    decode_frames,
)
from router.kv_index import KvIndex
from tests.router.fixture_captures import BLOCK_SIZE, read_capture

MODEL = "tiny"


def capture_events(name: str) -> list[list[KvEvent]]:
    return [decode_frames(c.frames).batch.events for c in read_capture(name)]


def prompts_of(name: str) -> list[tuple[list[int], str | None]]:
    """Full token sequences of every stored chain (following parents), with their salt."""
    tokens_of: dict[int | bytes, tuple[list[int], str | None]] = {}
    prompts = []
    for events in capture_events(name):
        for e in events:
            if not isinstance(e, BlockStored):
                continue
            if e.parent_block_hash is None:
                salt = e.extra_keys[0][0] if e.extra_keys and e.extra_keys[0] else None
                prefix: list[int] = []
            else:
                prefix, salt = tokens_of[e.parent_block_hash]
            for i, h in enumerate(e.block_hashes):
                prefix = prefix + e.token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]
                tokens_of[h] = (prefix, salt)
            prompts.append((prefix, salt))
    return prompts


def stored(
    hashes: Sequence[EngineBlockHash], tokens: list[int], parent: int | None = None, **kw: Any
) -> BlockStored:
    return BlockStored(list(hashes), parent, tokens, kw.pop("block_size", 4), medium="GPU", **kw)


def toks(start: int, n_blocks: int, bs: int = 4) -> list[int]:
    return list(range(start, start + n_blocks * bs))


def test_captured_traffic_is_indexed_under_recomputed_keys() -> None:
    idx = KvIndex(MODEL, BLOCK_SIZE)
    for events in capture_events("kv_events_samples"):
        idx.apply("a", events)
    prompts = prompts_of("kv_events_samples")
    assert len(prompts) > 50
    for tokens, salt in prompts:
        keys = idx.keys_for(tokens, cache_salt=salt)
        assert idx.match(keys) == {"a": len(keys)}
    c = idx.counters
    assert c.orphan_blocks == 0 and c.skipped_blocks == 0
    assert idx.blocks("a") == c.blocks_stored


def test_prefill_and_decode_captures_give_the_same_keys() -> None:
    """The decode engine reports blocks it pulled over NIXL; the index sees them on both."""
    idx = KvIndex(MODEL, BLOCK_SIZE)
    for events in capture_events("kv_events_pd_prefill"):
        idx.apply("prefill", events)
    for events in capture_events("kv_events_pd_decode"):
        idx.apply("decode", events)
    for tokens, salt in prompts_of("kv_events_pd_prefill"):
        keys = idx.keys_for(tokens, cache_salt=salt)
        assert idx.match(keys) == {"prefill": len(keys), "decode": len(keys)}


def test_salted_chain_only_matches_with_its_salt() -> None:
    idx = KvIndex(MODEL, BLOCK_SIZE)
    for events in capture_events("kv_events_pd_decode"):
        idx.apply("d", events)
    salted = [(t, s) for t, s in prompts_of("kv_events_pd_decode") if s is not None]
    assert salted
    tokens, salt = salted[0]
    assert idx.match(idx.keys_for(tokens, cache_salt=salt)) == {"d": len(tokens) // BLOCK_SIZE}
    assert idx.keys_for(tokens)[0] != idx.keys_for(tokens, cache_salt=salt)[0]
    assert idx.match(idx.keys_for(tokens, cache_salt="other")) == {}


def test_captured_evictions_and_clear_empty_the_index() -> None:
    idx = KvIndex(MODEL, BLOCK_SIZE)
    batches = capture_events("kv_events_samples_evict")
    seen_removal = False
    for events in batches:
        removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
        idx.apply("a", events)
        if removed:
            seen_removal = True
            assert idx.counters.blocks_removed >= len(removed)
    assert seen_removal
    assert any(isinstance(e, AllBlocksCleared) for events in batches for e in events)
    assert idx.blocks("a") == 0 and idx.stats().distinct_keys == 0
    assert idx.counters.clears == 1 and idx.counters.removed_unknown == 0


def test_match_counts_leading_blocks_per_replica() -> None:
    idx = KvIndex("m", 4)
    prompt = toks(0, 4)
    keys = idx.keys_for(prompt)
    idx.apply("a", [stored([1, 2, 3], prompt[:12])])
    idx.apply("b", [stored([1], prompt[:4])])
    # c holds blocks 2..3 of the prompt but not block 0: no leading overlap.
    idx.apply("c", [stored([9], prompt[:4]), BlockRemoved([9], "GPU")])
    idx.apply("c", [stored([1], prompt[:4]), stored([2, 3, 4], prompt[4:16], parent=1)])
    idx.apply("c", [BlockRemoved([1], "GPU")])
    assert idx.match(keys) == {"a": 3, "b": 1}
    assert idx.match(keys[:1]) == {"a": 1, "b": 1}
    assert idx.match([]) == {}
    assert sorted(idx.holders(keys[1])) == ["a", "c"]


def test_continuation_events_chain_from_the_parent_key() -> None:
    idx = KvIndex("m", 4)
    prompt = toks(100, 3)
    idx.apply("a", [stored([1], prompt[:4]), stored([2, 3], prompt[4:], parent=1)])
    assert idx.match(idx.keys_for(prompt)) == {"a": 3}


def test_duplicates_are_idempotent() -> None:
    idx = KvIndex("m", 4)
    prompt = toks(0, 2)
    for _ in range(3):
        idx.apply("a", [stored([1, 2], prompt)])
    assert idx.blocks("a") == 2
    assert idx.counters.duplicate_blocks == 4
    idx.apply("a", [BlockRemoved([2], "GPU")])
    assert idx.match(idx.keys_for(prompt)) == {"a": 1}
    idx.apply("a", [BlockRemoved([2], "GPU")])
    assert idx.counters.removed_unknown == 1


def test_unknown_parent_makes_orphans_that_are_not_indexed() -> None:
    idx = KvIndex("m", 4)
    idx.apply("a", [stored([5, 6], toks(0, 2), parent=404)])
    assert idx.blocks("a") == 0
    assert idx.counters.orphan_blocks == 2


def test_clear_and_remove_replica() -> None:
    idx = KvIndex("m", 4)
    prompt = toks(0, 2)
    keys = idx.keys_for(prompt)
    idx.apply("a", [stored([1, 2], prompt)])
    idx.apply("b", [stored([7, 8], prompt)])
    assert idx.clear_replica("a") == 2
    assert idx.match(keys) == {"b": 2}
    assert "a" in idx.replicas()
    idx.apply("a", [AllBlocksCleared(), stored([1], prompt[:4])])
    assert idx.match(keys) == {"b": 2, "a": 1}
    assert idx.remove_replica("b") == 2
    assert idx.replicas() == ["a"]
    # A new replica reuses b's bit and must not inherit its blocks.
    idx.apply("z", [stored([3], toks(500, 1))])
    assert idx.match(keys) == {"a": 1}
    assert idx.remove_replica("nope") == 0


def test_cap_drops_the_oldest_stored_entries_first() -> None:
    idx = KvIndex("m", 4, max_blocks_per_replica=3)
    a, b = toks(0, 2), toks(1000, 2)
    idx.apply("r", [stored([1, 2], a)])
    idx.apply("r", [stored([3, 4], b)])  # 4 entries > 3: block 1 (oldest) goes
    assert idx.blocks("r") == 3
    assert idx.counters.cap_evictions == 1
    assert idx.match(idx.keys_for(a)) == {}
    assert idx.match(idx.keys_for(b)) == {"r": 2}


def test_lora_and_salt_seed_the_chain() -> None:
    idx = KvIndex("m", 4)
    prompt = toks(0, 2)
    idx.apply(
        "a",
        [stored([1, 2], prompt, lora_name="ad", extra_keys=[["ad", "s1"], ["ad"]])],
    )
    assert idx.match(idx.keys_for(prompt, lora_name="ad", cache_salt="s1")) == {"a": 2}
    assert idx.match(idx.keys_for(prompt, lora_name="ad")) == {}
    assert idx.match(idx.keys_for(prompt, cache_salt="s1")) == {}
    assert idx.match(idx.keys_for(prompt)) == {}
    # A continuation of the salted LoRA chain keeps both.
    more = toks(0, 3)
    idx.apply("a", [stored([3], more[8:], parent=2, lora_name="ad", extra_keys=[["ad"]])])
    assert idx.match(idx.keys_for(more, lora_name="ad", cache_salt="s1")) == {"a": 3}


def test_blocks_the_index_cannot_key_are_skipped() -> None:
    idx = KvIndex("m", 4)
    prompt = toks(0, 3)
    idx.apply(
        "a",
        [
            BlockStored([1], None, prompt[:4], 8, medium="GPU"),  # other block size
            BlockStored([2], None, prompt[:4], 4, medium="CPU"),  # offload tier
            BlockStored([3], None, prompt[:4], 4, medium="GPU", group_idx=1),
            # A multimodal block: its identity is not in the token ids; the chain stops there.
            stored([4, 5, 6], prompt, extra_keys=[None, [["img-hash", 0]], None]),
        ],
    )
    assert idx.counters.skipped_blocks == 5
    assert idx.match(idx.keys_for(prompt)) == {"a": 1}
    # A CPU-tier removal does not touch the GPU entry.
    idx.apply("a", [BlockRemoved([4], "CPU")])
    assert idx.blocks("a") == 1


def test_same_engine_hash_with_other_tokens_is_repointed() -> None:
    idx = KvIndex("m", 4)
    a, b = toks(0, 1), toks(50, 1)
    idx.apply("r", [stored([1], a)])
    idx.apply("r", [stored([1], b)])
    assert idx.match(idx.keys_for(a)) == {}
    assert idx.match(idx.keys_for(b)) == {"r": 1}
    assert idx.blocks("r") == 1


def test_two_engine_hashes_for_one_key_keep_it_until_both_go() -> None:
    idx = KvIndex("m", 4)
    a = toks(0, 1)
    idx.apply("r", [stored([1], a), stored([2], a)])
    idx.apply("r", [BlockRemoved([1], "GPU")])
    assert idx.match(idx.keys_for(a)) == {"r": 1}
    idx.apply("r", [BlockRemoved([2], "GPU")])
    assert idx.match(idx.keys_for(a)) == {}


def test_keys_for_matches_block_keys() -> None:
    idx = KvIndex("m", 4)
    tokens = toks(0, 5)
    assert idx.keys_for(tokens, "l", "s") == block_keys(tokens, 4, KeySeed("m", "l", "s"))


def test_stats() -> None:
    idx = KvIndex("m", 4)
    idx.apply("a", [stored([1, 2], toks(0, 2))])
    idx.apply("b", [stored([1], toks(0, 1))])
    s = idx.stats()
    assert s.blocks_per_replica == {"a": 2, "b": 1}
    assert s.distinct_keys == 2
    assert s.counters["blocks_stored"] == 3
