"""Recent prompts' block-key chains, found again by their prefix (issue 15, router-walk).

A conversation's next turn, and every request behind a shared system prompt, re-hashes blocks
a recent prompt already hashed. ``ChainMemo`` keeps the chains of recent prompts and, for a
new prompt, reuses the keys of the longest *checkpoint* prefix it shares with one of them;
only the blocks after it are hashed (:func:`router.block_keys.block_keys` with ``parent``).
The keys are the same as without the memo, bit for bit: a reused key is the key of the very
same bytes under the very same seed (both are compared before reuse), and the chain is
continued from it exactly as :mod:`router.block_keys` defines it.

How a prefix is found (``E`` = ``every_blocks``, ``B`` = block size, ``buf`` = the prompt's
full blocks packed as ``le_u32``, see :mod:`router.block_keys`)::

    digest[j] = xxh3_64(buf[: (j + 1) · E · B · 4], seed=chain seed)     j = 0, 1, ...
    (one streaming pass over buf; a digest per checkpoint, every E blocks)
    for j from the last checkpoint down:
        entry = by_digest.get(digest[j])
        if entry and entry.seed == seed and entry.buf[:L] == buf[:L]:     L = (j + 1) · E · B · 4
            keys = entry.keys[: (j + 1) · E] + chain continued over the rest;  stop

Cost: one xxh3 pass over the packed prompt (~4 µs per 8k tokens), a dict probe per checkpoint,
and one ``memcmp`` of the shared prefix (~2 µs per 8k tokens) on a hit; a miss costs the same
probes and then every block, as without the memo. At 8k tokens and ``E`` = 32 a prompt that
shares all but its last 10 % with a recent one hashes 64 blocks instead of 512.

Memory: the entries keep each prompt's packed bytes and key list (~4 + 40/B bytes per token:
6.5 B at B = 16); oldest entries are dropped past ``max_tokens`` tokens in all (default
1,048,576 tokens: ~7 MB). Prompts shorter than one checkpoint are not kept (nothing to find).

Parameters (defaults): ``every_blocks`` 32 (512 tokens at B = 16: a shorter period finds longer
prefixes for more digests per prompt), ``max_tokens`` 1,048,576 (0 turns the memo off).
Not thread-safe: the one asyncio loop of the index owns it.

Public API: :class:`ChainMemo` (``keys``, ``hits``, ``misses``, ``blocks_reused``, ``tokens``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from xxhash import xxh3_64

from router.block_keys import chain_keys

DEFAULT_EVERY_BLOCKS = 32
DEFAULT_MAX_TOKENS = 1 << 20


@dataclass(slots=True, eq=False)
class _Entry:
    buf: bytes
    keys: list[int]
    seed: int
    digests: list[int]


class ChainMemo:
    """Block-key chains of recent prompts, reused by shared prefix (module docstring)."""

    __slots__ = (
        "_by_digest",
        "_entries",
        "blocks_reused",
        "every_blocks",
        "hits",
        "max_tokens",
        "misses",
        "tokens",
    )

    def __init__(
        self, every_blocks: int = DEFAULT_EVERY_BLOCKS, max_tokens: int = DEFAULT_MAX_TOKENS
    ) -> None:
        if every_blocks <= 0:
            raise ValueError(f"every_blocks must be positive, got {every_blocks}")
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.every_blocks = every_blocks
        self.max_tokens = max_tokens
        self._by_digest: dict[int, _Entry] = {}
        self._entries: deque[_Entry] = deque()
        self.tokens = 0  # tokens held by the entries
        self.hits = 0
        self.misses = 0
        self.blocks_reused = 0

    def keys(self, buf: bytes, block_size: int, seed: int) -> list[int]:
        """Keys of the full blocks packed in ``buf`` (``len(buf)`` a multiple of
        ``block_size · 4``), chained from ``seed``: :func:`router.block_keys.block_keys`'s."""
        step = block_size * 4
        n_blocks = len(buf) // step
        span = self.every_blocks * step
        n_checkpoints = n_blocks // self.every_blocks if self.max_tokens else 0
        if n_checkpoints == 0:
            return chain_keys(buf, 0, step, seed, [])
        stream = xxh3_64(seed=seed)
        view = memoryview(buf)
        digests: list[int] = []
        for end in range(span, n_checkpoints * span + 1, span):
            stream.update(view[end - span : end])
            digests.append(stream.intdigest())
        by_digest = self._by_digest
        keys: list[int] | None = None
        for j in range(n_checkpoints - 1, -1, -1):
            entry = by_digest.get(digests[j])
            if entry is None or entry.seed != seed:
                continue
            length = (j + 1) * span
            if entry.buf[:length] == buf[:length]:
                reused = (j + 1) * self.every_blocks
                keys = chain_keys(buf, length, step, entry.keys[reused - 1], entry.keys[:reused])
                self.hits += 1
                self.blocks_reused += reused
                break
        if keys is None:
            self.misses += 1
            keys = chain_keys(buf, 0, step, seed, [])
        self._remember(_Entry(buf, keys, seed, digests), n_blocks * block_size)
        return keys

    def _remember(self, entry: _Entry, tokens: int) -> None:
        if tokens > self.max_tokens:
            return
        by_digest = self._by_digest
        for digest in entry.digests:
            by_digest[digest] = entry  # the newest prompt with this prefix answers for it
        self._entries.append(entry)
        self.tokens += tokens
        while self.tokens > self.max_tokens:
            old = self._entries.popleft()
            self.tokens -= len(old.buf) // 4
            for digest in old.digests:
                if by_digest.get(digest) is old:
                    del by_digest[digest]
