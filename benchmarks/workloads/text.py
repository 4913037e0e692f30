"""Render workload segments as prompt text for live runs.

Each content id maps to an endless, deterministic stream of common English words, each written
with a leading space (`" river"`). Such words are one token each in the usual BPE vocabularies
(GPT-2/cl100k/o200k, Llama 2/3, Qwen, Mistral), so a segment of `n` tokens renders as `n` words
and is about `n` tokens long. Properties the harness relies on:

- equal `(content_id, n)` → equal text (pure function, no global state);
- the text of `(content_id, n)` is a prefix of the text of `(content_id, m)` for `n ≤ m`
  (word j depends only on `(content_id, j)`), so a trace block cut short at the end of a prompt
  shares its tokens with the full block, as in the source trace;
- every segment starts with a space, so BPE merges never cross segment boundaries and a shared
  prefix of segments is a shared prefix of tokens.

Word j of content c is `WORDS[mix64(c, j) % len(WORDS)]`, `mix64` being SplitMix64's finalizer
over `c + (j + 1)·φ64` (φ64 = 0x9E3779B97F4A7C15), computed vectorised with numpy.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from benchmarks.workloads.model import Segment, SessionSpec, output_content_id

__all__ = [
    "WORDS",
    "chat_messages",
    "completion_prompt",
    "completion_token_ids",
    "render_segment",
    "render_segments",
]

# Common short words; chosen to be single BPE tokens with a leading space in common vocabularies.
_WORD_LIST = """
    time year people way day man thing woman life child world school state family student
    group country problem hand part place case week company system program question work
    government number night point home water room mother area money story fact month lot
    right study book eye job word business issue side kind head house service friend father
    power hour game line end member law car city community name team minute idea kid body
    back parent face others level office door health person art war history party result
    change morning reason research girl guy moment air teacher force education foot boy age
    policy music market sense nation plan college interest death experience effect class
    control care field development role effort rate heart drug show leader light voice wife
    police mind price report decision son view relationship town road arm difference value
    building action model season society tax director position player record paper space
    ground form event official matter center couple site project activity star table need
    court oil situation cost industry figure street image phone data picture practice piece
    land product doctor wall patient worker news test movie north love support technology
    step baby computer type attention film tree source organization hair window evidence
    population site bank river table garden stone cloud paper summer winter spring autumn
    green blue red black white yellow brown silver golden bright dark quiet simple small
    large early late young old new good great high long little own other big public bad
    same able last local sure free better real full special easy clear recent certain
    personal open whole hard best strong possible major economic military true federal
    international low final main private medical common poor natural significant similar
    hot dead central happy serious ready left physical general environmental financial blue
    democratic dark various entire close legal religious cold foreign nice wrong past
    available middle human current national single red single short play run move live
    believe bring happen write provide sit stand lose pay meet include continue set learn
    lead understand watch follow stop create speak read allow add spend grow offer remember
    love consider appear buy wait serve die send expect build stay fall cut reach kill
    remain suggest raise pass sell require report decide pull return explain hope develop
    carry break receive agree support hit produce eat cover catch draw choose cause point
    listen realize place close seek mention rise sign accept wonder finish visit forget
    travel enjoy dance sing plant train paint clean cook drive swim climb jump walk talk
    apple bread chair clock dream earth field flower glass horse island jacket kitchen
    lemon market night ocean pencil queen rabbit salt tiger umbrella valley wheel yard zone
"""
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_WORD_LIST.split()))
_WORDS_ARRAY = np.array([" " + w for w in WORDS], dtype=object)
_NUM_WORDS = len(_WORDS_ARRAY)

_PHI = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _word_indices(content_id: int, n: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        j = np.arange(1, n + 1, dtype=np.uint64)
        x = np.uint64(content_id & 0xFFFFFFFFFFFFFFFF) + j * _PHI
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(_NUM_WORDS)).astype(np.int64)


@lru_cache(maxsize=1024)
def render_segment(content_id: int, num_tokens: int) -> str:
    """Text of one segment: `num_tokens` words, each with a leading space."""
    if num_tokens <= 0:
        return ""
    return "".join(_WORDS_ARRAY[_word_indices(content_id, num_tokens)])


def render_segments(segments: list[Segment]) -> str:
    """Concatenated text of `segments` (equal segment lists → equal text)."""
    return "".join(render_segment(s.content_id, s.num_tokens) for s in segments)


_EMPTY_TURN_TEXT = " continue"
"""User text of a turn that adds no new segments (e.g. an RL turn with no observation): chat
APIs reject empty user messages in some servers, so one word stands in for "nothing new"."""


def chat_messages(session: SessionSpec, turn: int) -> list[dict[str, str]]:
    """OpenAI chat messages for `turn` of `session`.

    With `carry_context`, earlier turns become alternating user/assistant messages; the
    assistant text is the rendering of `output_content_id(session_id, j)`, not what the server
    generated, so every run sends the same prompts. Without it, one user message.
    """
    if not session.carry_context:
        return [{"role": "user", "content": _user_text(session.turns[turn].new_segments)}]
    messages: list[dict[str, str]] = []
    for j in range(turn + 1):
        t = session.turns[j]
        messages.append({"role": "user", "content": _user_text(t.new_segments)})
        if j < turn:
            out = render_segment(output_content_id(session.session_id, j), t.output_tokens)
            messages.append({"role": "assistant", "content": out or _EMPTY_TURN_TEXT})
    return messages


def completion_prompt(session: SessionSpec, turn: int) -> str:
    """The whole prompt of `turn` as one string (for `/v1/completions`)."""
    return render_segments(session.prompt_segments(turn)) or _EMPTY_TURN_TEXT


TOKEN_ID_OFFSET = 3
"""First token id `completion_token_ids` uses: ids 0-2 are special in the simulated engine's
byte-level tokenizer (pad, BOS, EOS)."""
TOKEN_ID_RANGE = 256
"""Ids used: `TOKEN_ID_OFFSET .. TOKEN_ID_OFFSET + TOKEN_ID_RANGE - 1`, inside every vocabulary
(the byte-level fallback's has 259 ids)."""


def completion_token_ids(session: SessionSpec, turn: int) -> list[int]:
    """The whole prompt of `turn` as token ids: exactly `session.prompt_tokens(turn)` of them.

    Token j of segment c is `TOKEN_ID_OFFSET + (word j of c) % TOKEN_ID_RANGE`, so the
    rendering keeps the text's properties (equal segments, equal ids; a segment cut short is a
    prefix of the whole one). For servers whose tokenizer would not count the workload's
    tokens (the simulated engine's byte-level fallback makes ~6 tokens of a word): a prompt of
    ids is taken as it is, so the engine sees the trace's prompt length.
    """
    parts = [
        _word_indices(s.content_id, s.num_tokens)
        for s in session.prompt_segments(turn)
        if s.num_tokens > 0
    ]
    if not parts:
        return [TOKEN_ID_OFFSET]
    ids = np.concatenate(parts) % TOKEN_ID_RANGE + TOKEN_ID_OFFSET
    return [int(i) for i in ids]


def _user_text(segments: list[Segment]) -> str:
    return render_segments(segments) or _EMPTY_TURN_TEXT
