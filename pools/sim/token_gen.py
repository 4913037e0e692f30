"""Deterministic "sampling": each output token is a pure function of (seed, the sequence so far).

Why: a disaggregated run (prefill on one engine, decode on another) must return exactly the
tokens a colocated run returns, a preempted-and-recomputed request must not change its output,
and a request continued elsewhere from its prompt plus the tokens it already produced (the
coordinator's stream migration, `pdorch/app/migration.py`) must go on with exactly the tokens
the uninterrupted run would have produced, as greedy decoding of a real model does. So the
next token after the sequence `s` (prompt ids, then every output token so far) is

    x     = xxh3_64(s as little-endian uint32, seed=seed mod 2^64)
    token = the (x mod N)-th id of [0, vocab_size) without the excluded ids (N of them remain)

No dependence on timing, on which engine runs the step, or on where the prompt ends: the
sequence `prompt + [t0, t1]` continues with the same token whether `t0, t1` were generated or
sent as part of a longer prompt. The running hash (`xxhash.xxh3_64`, streamed: its digest equals
the one-shot hash of everything fed to it) costs O(1) per token. The core excludes
`eos_token_id`, so requests end by length unless a `stop_token_ids` entry is drawn.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

import xxhash

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


class SequenceHash:
    """A request's running sequence hash (`TokenGenerator.start`); copyable, so engine state
    can be deep-copied (xxhash's own object cannot be pickled)."""

    __slots__ = ("h",)

    def __init__(self, h: xxhash.xxh3_64) -> None:
        self.h = h

    def __copy__(self) -> SequenceHash:
        return SequenceHash(self.h.copy())

    def __deepcopy__(self, memo: dict[int, object]) -> SequenceHash:
        return SequenceHash(self.h.copy())


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
    def start(prompt_token_ids: Sequence[int], seed: int | None) -> SequenceHash:
        """The running hash of a request's sequence, fed its prompt (`next` extends it)."""
        h = xxhash.xxh3_64(seed=(seed or 0) & _M64)
        if prompt_token_ids:
            h.update(array("I", prompt_token_ids).tobytes())
        return SequenceHash(h)

    def next(self, state: SequenceHash) -> int:
        """The token after the sequence `state` has seen; `state` is extended with it."""
        h = state.h
        t = self._id(h.intdigest())
        h.update(t.to_bytes(4, "little"))
        return t

    def positional(self, seed: int | None, position: int) -> int:
        """Token-free requests (no ids, nothing to hash; nobody reads their tokens but the
        stop check): a function of (seed, output position) only, so the engine's
        fast-forward stretches, which skip them, stay identical to stepping."""
        z = ((seed or 0) + (position + 1) * _GOLDEN) & _M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        return self._id(z ^ (z >> 31))

    def _id(self, x: int) -> int:
        t = x % self._n
        if self._excluded:
            # Map rank t among allowed ids to the id: skip every excluded id at or below it.
            for ex in self._excluded:
                if ex <= t:
                    t += 1
                else:
                    break
        return t

    def after(self, sequence: Sequence[int], seed: int | None) -> int:
        """The token after `sequence` (one-shot, O(len): tests and references)."""
        return self.next(self.start(sequence, seed))

    def tokens(self, prompt_token_ids: Sequence[int], seed: int | None, n: int) -> list[int]:
        """The first `n` output tokens for this prompt and seed (tests, references)."""
        state = self.start(prompt_token_ids, seed)
        return [self.next(state) for _ in range(n)]
