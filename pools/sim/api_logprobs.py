"""Simulated log-probabilities in vLLM 0.32's wire shapes (completions and chat).

The simulated engine does not sample (`token_gen.py`), so there is no distribution to read
numbers from; what a client needs is the *shape* vLLM answers, with values that are
deterministic and self-consistent:

- the chosen token's logprob: `-(1 + t mod 7) / 20` for token id `t` (in [-0.35, -0.05]);
- the `k` alternatives: ids `t + 1 .. t + k` (mod the vocabulary), each `0.5` lower than the
  one before, so the chosen token always ranks first (`rank` 1), as under greedy decoding.

Shapes (vLLM's `CompletionLogProbs` / `ChatCompletionLogProbs`, re-implemented):
- completions (`logprobs: k`): `{"text_offset", "token_logprobs", "tokens", "top_logprobs"}`;
  `top_logprobs` per token a `{text: logprob}` dict of the chosen token and `k` others (up to
  `k + 1` entries, fewer when texts collide); echoed prompt tokens come first, the very first
  with `null` logprob and `null` top entry as vLLM has no logprob for it;
- chat (`logprobs: true`, `top_logprobs: k`): `{"content": [{"token", "logprob", "bytes",
  "top_logprobs": [k entries of {"token", "logprob", "bytes"}]}]}`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pools.sim.tokenization import SimTokenizer

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


def chosen_logprob(token_id: int) -> float:
    return -(1 + token_id % 7) / 20


def _alternatives(token_id: int, k: int, vocab: int) -> list[tuple[int, float]]:
    base = chosen_logprob(token_id)
    return [((token_id + i) % vocab, base - 0.5 * i) for i in range(1, k + 1)]


def completion_logprobs(
    tokenizer: SimTokenizer,
    token_ids: Sequence[int],
    k: int,
    offset: int,
    *,
    first_is_prompt_start: bool = False,
) -> dict[str, Any]:
    """Completions' `logprobs` object for `token_ids`; `offset` is the text length before the
    first of them (`text_offset`). `first_is_prompt_start`: the first token is the prompt's
    first (echo), which has no logprob."""
    vocab = tokenizer.vocab_size
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for i, t in enumerate(token_ids):
        text = tokenizer.token_text(t)
        offsets.append(offset)
        offset += len(text)
        tokens.append(text)
        if first_is_prompt_start and i == 0:
            values.append(None)
            tops.append(None)
            continue
        value = chosen_logprob(t)
        values.append(value)
        top = {text: value}
        for alt, lp in _alternatives(t, k, vocab):
            top.setdefault(tokenizer.token_text(alt), lp)
        tops.append(top)
    return {
        "text_offset": offsets,
        "token_logprobs": values,
        "tokens": tokens,
        "top_logprobs": tops,
    }


def _entry(tokenizer: SimTokenizer, token_id: int, value: float) -> dict[str, Any]:
    text = tokenizer.token_text(token_id)
    return {"token": text, "logprob": value, "bytes": list(text.encode())}


def chat_logprobs(tokenizer: SimTokenizer, token_ids: Sequence[int], k: int) -> dict[str, Any]:
    """Chat's `logprobs` object (`{"content": [...]}`) for `token_ids`, `k` top entries each."""
    vocab = tokenizer.vocab_size
    content = []
    for t in token_ids:
        entry = _entry(tokenizer, t, chosen_logprob(t))
        top = [_entry(tokenizer, t, chosen_logprob(t))] if k else []
        top += [_entry(tokenizer, alt, lp) for alt, lp in _alternatives(t, k - 1, vocab)]
        entry["top_logprobs"] = top
        content.append(entry)
    return {"content": content}
