"""`ChainMemo`: a memo of recent prompts' key chains gives exactly the keys `block_keys` gives
without it (conversations that grow turn by turn, shared system prompts, other seeds over the
same tokens, a prefix that differs inside a checkpoint, evictions), and it does reuse them."""

from __future__ import annotations

import random

import numpy as np
import pytest

from router.block_keys import KeySeed, block_keys, seed_value
from router.chain_memo import ChainMemo
from router.kv_index import KvIndex

BS = 16


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(200_000) for _ in range(n)]


@pytest.mark.parametrize(
    ("every", "budget"), [(1, 1 << 20), (4, 1 << 20), (32, 1 << 20), (4, 3000)]
)
def test_memo_keys_equal_plain_keys(every: int, budget: int) -> None:
    rng = random.Random(every * 7 + budget)
    memo = ChainMemo(every_blocks=every, max_tokens=budget)
    system = _tokens(rng, 40 * BS + 5)
    conversations: list[list[int]] = [list(system) for _ in range(4)]
    seeds = [seed_value("m"), seed_value("m", "lora"), seed_value("m", None, "salt")]
    for turn in range(60):
        c = rng.randrange(len(conversations))
        convo = conversations[c]
        convo.extend(_tokens(rng, rng.randrange(1, 300)))  # the next turn appends
        prompt = list(convo)
        if rng.random() < 0.2 and len(prompt) > 10:  # one token changed somewhere inside
            prompt[rng.randrange(len(prompt))] += 1
        seed = rng.choice(seeds)
        want = block_keys(prompt, BS, seed)
        assert block_keys(prompt, BS, seed, memo=memo) == want, turn
        assert memo.tokens <= budget
    assert memo.hits > 0 and memo.blocks_reused > 0
    assert memo.misses > 0


def test_memo_distinguishes_seeds_over_the_same_tokens() -> None:
    rng = random.Random(3)
    memo = ChainMemo(every_blocks=2)
    prompt = _tokens(rng, 20 * BS)
    plain = block_keys(prompt, BS, KeySeed("m"))
    salted = block_keys(prompt, BS, KeySeed("m", None, "s"))
    assert plain != salted
    assert block_keys(prompt, BS, KeySeed("m"), memo=memo) == plain
    assert block_keys(prompt, BS, KeySeed("m", None, "s"), memo=memo) == salted
    assert memo.hits == 0
    assert block_keys([*prompt, 1], BS, KeySeed("m"), memo=memo) == plain
    assert memo.hits == 1 and memo.blocks_reused == 20


def test_memo_reuses_the_longest_checkpoint_and_takes_numpy() -> None:
    rng = random.Random(4)
    memo = ChainMemo(every_blocks=8)
    first = _tokens(rng, 100 * BS)
    block_keys(first, BS, 1, memo=memo)
    second = first[: 90 * BS + 3] + _tokens(rng, 10 * BS)  # shares 90 blocks: checkpoint 88
    keys = block_keys(np.array(second, dtype=np.int64), BS, 1, memo=memo)
    assert keys == block_keys(second, BS, 1)
    assert (memo.hits, memo.blocks_reused) == (1, 88)


def test_memo_off_and_short_prompts_keep_nothing() -> None:
    rng = random.Random(5)
    off = ChainMemo(max_tokens=0)
    prompt = _tokens(rng, 64 * BS)
    assert block_keys(prompt, BS, 9, memo=off) == block_keys(prompt, BS, 9)
    assert block_keys(prompt, BS, 9, memo=off) == block_keys(prompt, BS, 9)
    assert (off.hits, off.tokens) == (0, 0)
    memo = ChainMemo(every_blocks=32)
    assert block_keys(prompt[: 31 * BS], BS, 9, memo=memo) == block_keys(prompt[: 31 * BS], BS, 9)
    assert memo.tokens == 0
    with pytest.raises(ValueError):
        ChainMemo(every_blocks=0)


def test_index_keys_for_uses_its_memo() -> None:
    rng = random.Random(6)
    index = KvIndex("m", BS)
    base = _tokens(rng, 64 * BS)
    assert index.keys_for(base, lora_name="a") == block_keys(base, BS, KeySeed("m", "a"))
    turn = base + _tokens(rng, 40)
    assert index.keys_for(turn, lora_name="a") == block_keys(turn, BS, KeySeed("m", "a"))
    assert index.chains.hits == 1 and index.chains.blocks_reused == 64
