"""Block identities from workload segments, without token ids (the token-free fast path).

A prompt is a stream of segments (`benchmarks/workloads/model.py`); the tokens at offset `o`
of segment `(content_id, num_tokens)` are a pure function of the three. Block `j` of a
sequence (tokens `[j*B, (j+1)*B)`) is identified by a chain, as vLLM chains block hashes:

    id(j) = hash((id(j-1), content_id, num_tokens, offset))        block inside one segment
    id(j) = hash((id(j-1), ((cid, n, offset, length), ...)))        block spanning segments

with `id(-1) = seed` and Python's tuple hash of ints (deterministic across processes: ints
and tuples are not salted), masked to 64 bits. Equal prefixes give equal ids, a difference
anywhere changes every later id. Cost: one tuple hash per block (~0.2 us), no token lists.

`BlockChain` is incremental: a multi-turn session extends one chain with each turn's new
segments and output, so turn k's prompt ids are a prefix of its full sequence ids and of
turn k+1's prompt ids (what a real prefix cache sees in a chat).
"""

from __future__ import annotations

from benchmarks.workloads.model import Segment

MASK64 = (1 << 64) - 1


class BlockChain:
    """Chained block ids over appended segments (see the module docstring)."""

    __slots__ = ("as_bytes", "block_size", "fill", "ids", "num_tokens", "parent", "pieces")

    def __init__(self, block_size: int, seed: int = 0) -> None:
        self.block_size = block_size
        self.ids: list[int] = []
        self.as_bytes: list[bytes] = []
        self.pieces: list[tuple[int, int, int, int]] = []
        self.fill = 0
        self.parent = seed & MASK64
        self.num_tokens = 0

    def extend(self, segments: list[Segment]) -> None:
        bs = self.block_size
        ids = self.ids
        out = self.as_bytes
        parent = self.parent
        fill = self.fill
        pieces = self.pieces
        for seg in segments:
            cid = seg.content_id
            n = seg.num_tokens
            self.num_tokens += n
            off = 0
            while off < n:
                take = bs - fill
                if take > n - off:
                    take = n - off
                if fill == 0 and take == bs:
                    parent = hash((parent, cid, n, off)) & MASK64
                    ids.append(parent)
                    out.append(parent.to_bytes(8, "big"))
                else:
                    pieces.append((cid, n, off, take))
                    fill += take
                    if fill == bs:
                        parent = hash((parent, tuple(pieces))) & MASK64
                        ids.append(parent)
                        out.append(parent.to_bytes(8, "big"))
                        pieces = []
                        fill = 0
                off += take
        self.parent = parent
        self.fill = fill
        self.pieces = pieces
