"""pdorch's own block keys: stable values, chaining, seeds."""

from __future__ import annotations

import numpy as np
import pytest
from xxhash import xxh3_64_intdigest

from router.block_keys import KeySeed, block_keys, seed_value
from router.kv_events import BlockStored, decode_frames
from tests.router.fixture_captures import read_capture


def test_keys_are_stable_across_versions() -> None:
    """Pinned values: changing the formula silently would split every coordinator's index."""
    assert seed_value("tiny") == 9401872165501592496
    assert seed_value("tiny", "lora-a") == 15377650523000177207
    assert seed_value("tiny", None, "salt") == 1185346830128007383
    assert block_keys(list(range(64)), 16, KeySeed("tiny")) == [
        9521130064303463747,
        13838606523305883056,
        9242487306543615980,
        7536991322878850170,
    ]


def test_keys_of_a_captured_prompt_are_stable() -> None:
    event = decode_frames(read_capture("kv_events_samples")[0].frames).batch.events[0]
    assert isinstance(event, BlockStored)
    assert block_keys(event.token_ids, 32, KeySeed("tiny")) == [
        12322326244984777204,
        562183915161904291,
        14040310270286720792,
        13738111169765454350,
    ]


def test_formula_is_the_documented_chain() -> None:
    tokens = [5, 6, 7, 8, 9, 10, 11]
    seed = KeySeed("m", "l", "s")
    k0 = xxh3_64_intdigest(np.array([5, 6, 7], dtype="<u4").tobytes(), seed.value)
    k1 = xxh3_64_intdigest(np.array([8, 9, 10], dtype="<u4").tobytes(), k0)
    assert block_keys(tokens, 3, seed) == [k0, k1]  # token 11 is a partial block: no key


def test_partial_and_empty_prompts() -> None:
    assert block_keys([], 16, KeySeed("m")) == []
    assert block_keys(list(range(15)), 16, KeySeed("m")) == []
    assert len(block_keys(list(range(33)), 16, KeySeed("m"))) == 2


def test_numpy_tuple_and_list_inputs_agree() -> None:
    tokens = list(range(1000, 1100))
    seed = KeySeed("m")
    expected = block_keys(tokens, 8, seed)
    assert block_keys(tuple(tokens), 8, seed) == expected
    assert block_keys(np.array(tokens, dtype=np.int64), 8, seed) == expected
    assert block_keys(tokens, 8, seed.value) == expected


def test_parent_continues_the_chain() -> None:
    tokens = list(range(64))
    seed = KeySeed("m")
    full = block_keys(tokens, 16, seed)
    tail = block_keys(tokens[32:], 16, seed, parent=full[1])
    assert tail == full[2:]


def test_every_seed_field_changes_every_key() -> None:
    tokens = list(range(64))
    variants = [
        KeySeed("m"),
        KeySeed("m2"),
        KeySeed("m", "lora"),
        KeySeed("m", None, "salt"),
        KeySeed("m", "", None),
        KeySeed("m", None, ""),
    ]
    chains = [block_keys(tokens, 16, s) for s in variants]
    for i in range(len(chains)):
        for j in range(i + 1, len(chains)):
            assert not set(chains[i]) & set(chains[j]), (variants[i], variants[j])


def test_a_different_token_changes_its_block_and_all_later_keys() -> None:
    a = list(range(64))
    b = list(a)
    b[20] = 9999
    ka, kb = block_keys(a, 16, KeySeed("m")), block_keys(b, 16, KeySeed("m"))
    assert ka[0] == kb[0]
    assert all(x != y for x, y in zip(ka[1:], kb[1:], strict=True))


def test_bad_inputs() -> None:
    with pytest.raises(ValueError):
        block_keys([1, 2], 0, KeySeed("m"))
    with pytest.raises(OverflowError):
        block_keys([-1, 2], 2, KeySeed("m"))
