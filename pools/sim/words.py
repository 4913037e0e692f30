"""The readable demo mode of the simulated engine: a word-level tokenizer and a sentence generator.

Opt-in (`tokenizer: builtin:words` on a sim launch spec, `--tokenizer builtin:words`); `pdorch
serve` with no arguments uses it, every other user of the sim keeps the byte fallback and the
hash generator (`token_gen.py`), so their token ids and results do not change.

Vocabulary (`words.txt`, written for pdorch; one class per `# [class]` section):

- ids `0` (pad), `BOS = 1`, `EOS = 2`, byte `b` = id `b + 3` (as `ByteTokenizer`: anything that is
  not a known word, punctuation and spaces included, is spelt in bytes, so every text round-trips);
- then each distinct word `w` in four forms, in file order: `" w"`, `"w"`, `" W"`, `"W"`
  (capitalised first letter), so ``id = 259 + 4 * index + form``.
- Encoding cuts the text into ``" ?[A-Za-z]+"`` pieces and single other characters; a piece in
  the table is one id, anything else its UTF-8 bytes. Completions: `[BOS] + ids`; chat: `[BOS]`
  + the encoding of ``"<|{role}|>\\n{content}\\n"`` per message (+ ``"<|assistant|>\\n"``).

Generation (`WordGenerator`, same contract as `TokenGenerator`: the next token is a pure function
of (seed, the whole sequence), so P/D, preemption and stream migration give identical text):

    slot  = fold of the sequence through the sentence grammar below (unknown tokens keep it)
    x     = xxh3_64(sequence as little-endian uint32, seed)      (as token_gen)
    token = the word of slot's class at index (x mod len(class)); where a slot has two choices,
            bit 32 of x picks.

Grammar: ``Det [Adj] Noun Verb Det [Adj] Noun [Prep Det Noun] "."``; a sentence starts with a
capitalised determiner (``" The"``). Slots: 0 start, 1/2 subject det/adj, 3 subject noun, 4 verb,
5/6 object det/adj, 7 object noun, 8 preposition, 9 its det, 10 its noun.
"""

from __future__ import annotations

import functools
import re
from array import array
from collections.abc import Sequence
from importlib import resources
from typing import Any

import xxhash

from pools.sim.token_gen import SequenceHash

WORDS_TOKENIZER = "builtin:words"
"""The `tokenizer` value that selects this mode (not a path: never resolved against a file)."""

BOS, EOS, OFFSET = 1, 2, 3
FIRST_WORD = 256 + OFFSET
_PIECE = re.compile(r" ?[A-Za-z]+|.", re.S)
_M64 = (1 << 64) - 1
_PERIOD = ord(".") + OFFSET
_SENTENCE_END = frozenset({_PERIOD, ord("!") + OFFSET, ord("?") + OFFSET, ord("\n") + OFFSET, BOS})
DET, ADJ, NOUN, VERB, PREP = "det", "adj", "noun", "verb", "prep"


class Vocabulary:
    """The word table read from `words.txt` (see the module docstring for the id layout)."""

    def __init__(self, text: str) -> None:
        self.words: list[str] = []
        self.classes: dict[str, list[str]] = {}
        seen: set[str] = set()
        cls = "other"
        for line in text.splitlines():
            m = re.fullmatch(r"#\s*\[(\w+)\]\s*", line)
            if m:
                cls = m.group(1)
                continue
            if line.startswith("#"):
                continue
            for w in line.split():
                if w not in seen:  # a word's first section is its class
                    seen.add(w)
                    self.words.append(w)
                    self.classes.setdefault(cls, []).append(w)
        self.ids: dict[str, int] = {}
        self.texts: list[str] = ["", "", ""] + [
            bytes([b]).decode("utf-8", errors="replace") for b in range(256)
        ]
        for w in self.words:
            cap = w[0].upper() + w[1:]
            for piece in (" " + w, w, " " + cap, cap):
                self.ids.setdefault(piece, len(self.texts))
                self.texts.append(piece)
        self.vocab_size = len(self.texts)

    def spaced(self, word: str, capital: bool = False) -> int:
        """The id of `" word"` (or `" Word"`)."""
        return self.ids[" " + (word[0].upper() + word[1:] if capital else word)]


@functools.lru_cache(maxsize=1)
def vocabulary() -> Vocabulary:
    return Vocabulary(resources.files("pools.sim").joinpath("words.txt").read_text("utf-8"))


def vocabulary_words() -> list[str]:
    """Every word of the vocabulary (lower case, file order)."""
    return list(vocabulary().words)


class WordTokenizer:
    """`SimTokenizer` over `vocabulary()` (see the module docstring)."""

    def __init__(self) -> None:
        self.name = WORDS_TOKENIZER
        self._v = vocabulary()
        self.vocab_size = self._v.vocab_size
        self.eos_token_id: int | None = EOS

    def encode_prompt(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [BOS] if add_special_tokens else []
        table = self._v.ids
        for m in _PIECE.finditer(text):
            piece = m.group()
            t = table.get(piece)
            if t is not None:
                ids.append(t)
            else:
                ids.extend(b + OFFSET for b in piece.encode())
        return ids

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        from pools.sim.tokenization import _content_text

        parts = [
            f"<|{m.get('role', 'user')}|>\n{_content_text(m.get('content'))}\n" for m in messages
        ]
        if add_generation_prompt:
            parts.append("<|assistant|>\n")
        return self.encode_prompt("".join(parts), add_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        texts = self._v.texts
        return texts[token_id] if 0 <= token_id < len(texts) else ""

    def decode(self, token_ids: Sequence[int]) -> str:
        # bytes are gathered so a multi-byte character spelt in byte ids decodes whole
        out = bytearray()
        texts = self._v.texts
        for t in token_ids:
            if OFFSET <= t < FIRST_WORD:
                out.append(t - OFFSET)
            elif FIRST_WORD <= t < len(texts):
                out += texts[t].encode()
        return out.decode("utf-8", errors="replace")


class WordState(SequenceHash):
    """The running sequence hash plus the grammar slot the sequence has reached."""

    __slots__ = ("slot",)

    def __init__(self, h: xxhash.xxh3_64, slot: int) -> None:
        super().__init__(h)
        self.slot = slot

    def __copy__(self) -> WordState:
        return WordState(self.h.copy(), self.slot)

    def __deepcopy__(self, memo: dict[int, object]) -> WordState:
        return WordState(self.h.copy(), self.slot)


class WordGenerator:
    """Readable sentences (see the module docstring); the scheduler's generator in words mode."""

    def __init__(self) -> None:
        v = vocabulary()
        self.vocab_size = v.vocab_size
        self._choices: dict[str, list[int]] = {
            c: [v.spaced(w) for w in v.classes[c]] for c in (DET, ADJ, NOUN, VERB, PREP)
        }
        self._caps = [v.spaced(w, capital=True) for w in v.classes[DET]]
        self._class: dict[int, str] = {}
        for c in (DET, ADJ, NOUN, VERB, PREP):
            for w in v.classes[c]:
                for t in (v.spaced(w), v.spaced(w, True), v.ids[w], v.ids[w[0].upper() + w[1:]]):
                    self._class[t] = c

    def _fold(self, slot: int, token: int) -> int:
        """The grammar slot after `token` (total: any token in any slot)."""
        if token in _SENTENCE_END:
            return 0
        c = self._class.get(token)
        if c is None:
            return slot
        phase = 0 if slot <= 2 else (1 if slot <= 6 else 2)
        if c == DET:
            return (1, 5, 9)[phase]
        if c == ADJ:
            return (2, 6, 9)[phase]
        if c == NOUN:
            return (3, 7, 10)[phase]
        return 4 if c == VERB else 8

    def start(self, prompt_token_ids: Sequence[int], seed: int | None) -> WordState:
        h = xxhash.xxh3_64(seed=(seed or 0) & _M64)
        slot = 0
        if prompt_token_ids:
            h.update(array("I", prompt_token_ids).tobytes())
            for t in prompt_token_ids:
                slot = self._fold(slot, t)
        return WordState(h, slot)

    def next(self, state: SequenceHash) -> int:
        assert isinstance(state, WordState)
        h = state.h
        x = h.intdigest()
        slot = state.slot
        pick = (x >> 32) & 1
        ch = self._choices
        if slot == 0:
            options = self._caps
        elif slot in (1, 5):
            options = ch[ADJ] if pick else ch[NOUN]
        elif slot in (2, 6, 9):
            options = ch[NOUN]
        elif slot == 3:
            options = ch[VERB]
        elif slot in (4, 8):
            options = ch[DET]
        elif slot == 7 and pick:
            options = ch[PREP]
        else:
            options = [_PERIOD]
        t = options[x % len(options)]
        h.update(t.to_bytes(4, "little"))
        state.slot = self._fold(slot, t)
        return t

    def positional(self, seed: int | None, position: int) -> int:
        """Token-free requests: nobody reads their tokens; a period is never a stop token."""
        return _PERIOD

    def tokens(self, prompt_token_ids: Sequence[int], seed: int | None, n: int) -> list[int]:
        """The first `n` output tokens for this prompt and seed (tests, references)."""
        state = self.start(prompt_token_ids, seed)
        return [self.next(state) for _ in range(n)]
