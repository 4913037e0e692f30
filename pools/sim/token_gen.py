"""Deterministic "sampling": output token ids as a pure function of (prompt, seed, position).

Why: a disaggregated run (prefill on one engine, decode on another) must return exactly the
tokens a colocated run returns, and a preempted-and-recomputed request must not change its
output. So token `k` (0 = first output token) is

    base  = xxh3_64(prompt ids as little-endian uint32, seed=seed mod 2^64)
    x_k   = splitmix64(base + (k + 1)·0x9E3779B97F4A7C15)
    token = the (x_k mod N)-th id of [0, vocab_size) without the excluded ids (N of them remain)

No dependence on earlier outputs, on timing or on which engine runs the step. The core
excludes `eos_token_id`, so requests end by length unless a `stop_token_ids` entry is drawn.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

import xxhash

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


class TokenGenerator:
    """See the module docstring."""

    __slots__ = ("_excluded", "_n", "vocab_size")

    def __init__(self, vocab_size: int, *, exclude: Iterable[int] = ()) -> None:
        excluded = sorted({t for t in exclude if 0 <= t < vocab_size})
        if vocab_size - len(excluded) < 1:
            raise ValueError(f"vocab_size {vocab_size} leaves no token to generate")
        self.vocab_size = vocab_size
        self._excluded = excluded
        self._n = vocab_size - len(excluded)

    @staticmethod
    def base(prompt_token_ids: Sequence[int], seed: int | None) -> int:
        data = array("I", prompt_token_ids).tobytes()
        return xxhash.xxh3_64_intdigest(data, seed=(seed or 0) & _M64)

    def token(self, base: int, position: int) -> int:
        z = (base + (position + 1) * _GOLDEN) & _M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        t = (z ^ (z >> 31)) % self._n
        if self._excluded:
            # Map rank t among allowed ids to the id: skip every excluded id at or below it.
            for ex in self._excluded:
                if ex <= t:
                    t += 1
                else:
                    break
        return t

    def tokens(self, prompt_token_ids: Sequence[int], seed: int | None, n: int) -> list[int]:
        """The first `n` output tokens for this prompt and seed (tests, references)."""
        b = self.base(prompt_token_ids, seed)
        return [self.token(b, k) for k in range(n)]
