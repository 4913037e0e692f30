"""The sim's readable mode (`pools/sim/words.py`): words in, sentences out, same contract as the
hash generator (a pure function of the sequence), and opt-in only."""

from __future__ import annotations

import copy
import re
from typing import Literal

from pools.sim.config import EngineConfig
from pools.sim.engine_core import EngineCore
from pools.sim.request import SimRequest
from pools.sim.timing import make_timing
from pools.sim.token_gen import TokenGenerator
from pools.sim.tokenization import ByteTokenizer, load_tokenizer
from pools.sim.words import WORDS_TOKENIZER, WordGenerator, WordTokenizer, vocabulary_words

TEXTS = [
    "Tell me a story about the sea.",
    "Hello",
    "Zyx qwv! naïve café, 42 — ok?\n\tThe END",
    "",
]


def test_every_text_round_trips_and_known_words_are_one_token() -> None:
    tok = WordTokenizer()
    for text in TEXTS:
        ids = tok.encode_prompt(text)
        assert ids[0] == 1 and tok.decode(ids) == text
        assert "".join(tok.token_text(t) for t in ids) == text or not text.isascii()
    # " story", "Tell", " the": one id each; the period is a byte id
    assert len(tok.encode_prompt("Tell me a story about the sea.", add_special_tokens=False)) == 8
    assert len(vocabulary_words()) >= 800 and tok.vocab_size == 259 + 4 * len(vocabulary_words())
    assert load_tokenizer(WORDS_TOKENIZER).name == WORDS_TOKENIZER
    assert isinstance(load_tokenizer(None), ByteTokenizer)  # the default is unchanged


def test_output_is_sentences_of_vocabulary_words_and_a_function_of_the_sequence() -> None:
    tok, gen = WordTokenizer(), WordGenerator()
    words = set(vocabulary_words())
    prompt = tok.encode_prompt("Tell me a story about the sea.")
    out = gen.tokens(prompt, None, 200)
    text = "".join(tok.token_text(t) for t in out)
    sentences = [s.strip() for s in text.split(".")[:-1]]
    assert len(sentences) >= 10
    for s in sentences:
        found = s.split()
        assert 5 <= len(found) <= 10 and found[0][0].isupper(), s
        assert all(w.lower() in words for w in found), s
    assert re.fullmatch(r"( [A-Za-z]+|\.)+", text)
    # continued from prompt + its first outputs (migration), or from a copied state (P/D,
    # preemption): the same tokens
    assert gen.tokens(prompt + out[:37], None, 50) == out[37:87]
    state = gen.start(prompt, None)
    for _ in range(11):
        gen.next(state)
    twin = copy.deepcopy(state)
    assert [gen.next(state) for _ in range(20)] == [gen.next(twin) for _ in range(20)]
    assert gen.tokens(prompt, 7, 40) != out[:40]  # the seed matters


def test_the_engine_core_generates_words_only_when_asked() -> None:
    timing = make_timing("llama-3.1-8b", "h100")
    tok = WordTokenizer()
    prompt = tok.encode_prompt("Once upon a time " * 20)

    def run(text: Literal["hash", "words"]) -> list[int]:
        config = EngineConfig(
            block_size=16, num_gpu_blocks=100, vocab_size=tok.vocab_size, eos_token_id=2, text=text
        )
        core = EngineCore(config, timing)
        core.add_request(SimRequest("r", prompt, max_tokens=30), 0.0)
        now, ids = 0.0, []
        while core.has_unfinished():
            step = core.step(now)
            ids += [t for o in step.outputs for t in o.new_token_ids]
            now = step.end
        return ids

    assert run("words") == WordGenerator().tokens(prompt, None, 30)
    hashed = run("hash")
    assert hashed == TokenGenerator(tok.vocab_size, exclude=[2]).tokens(prompt, None, 30)
    assert EngineConfig().text == "hash"
