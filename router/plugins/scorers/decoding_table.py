"""The (replica, sequence) table behind `token_load`'s straggler-aware decode term.

`remaining_decode` needs, per candidate `r` and for this request's horizon `out`, two sums over
the sequences `r` decodes (router/plugins/scorers/token_load.py):

    s_j     = out if rem_j < 0 (no max_tokens) else min(out, rem_j)
    S1(r)   = Σ_j s_j                 shared decode steps
    S2(r)   = Σ_j s_j · blocks_j      shared steps weighted by each sequence's KV blocks

A Python loop over every replica's sequences at each pick cost ~1 µs per row (256 replicas:
~270 µs of a 0.8 ms decision, benchmarks/results/router-defaults-7/). Here each row's sequences
sit in a padded table (rows x `cap`), one row rewritten only when that replica's `decoding`
tuple changed (a `TokenLoad` keeps the same tuple object until the replica's load changes).
Columns from a `ColumnBuilder` say which rows got a new load since a given build
(`RowVersions`), so a pick checks only those rows by identity; other columns get an identity
scan of every row (~40 ns a row: ~120 µs of a 1,024-replica pick, router-straggler-vec, before
`RowVersions`). Both sums are three array operations over the table whatever the fleet size;
the sums of the last horizon asked for are kept and updated only on the rewritten rows. A
sequence without `max_tokens` is stored as `UNKNOWN_REMAINING` so that `min(out, rem)` is
`out`; an empty slot is (0, 0), which adds 0.

The sums are integers (held in float64, exact below 2**53), so they are exact in any order:
the scalar paths (`shared_sums`) and this table give the same S1, S2, and the scorer's one
float expression on them gives the same score bit for bit on every path.

The table is a cache of the candidates' own `decoding` tuples (the decision stays a pure
function of the request and the candidates): `DecodingTables` keeps one table per candidate id
list (a `ColumnBuilder` keeps one list per pool until its replicas change).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from operator import is_not

import numpy as np

from router.replica_columns import BoolArray, FloatArray, IntArray, ReplicaColumns, RowVersions

UNKNOWN_REMAINING = 1 << 62
"""Stored remaining output of a sequence without `max_tokens`: larger than any horizon."""

Decoding = tuple[tuple[int, int], ...]


def shared_sums(decoding: Decoding, out: int) -> tuple[int, int]:
    """(S1, S2) of one replica's `decoding` for horizon `out` (module docstring), in Python:
    the scalar paths' version of `DecodingTable.sums`."""
    s1 = s2 = 0
    for rem, blocks in decoding:
        shared = out if rem < 0 or rem > out else rem
        s1 += shared
        s2 += shared * blocks
    return s1, s2


class DecodingTable:
    """One candidate list's decoding sequences as a padded (row, slot) table."""

    __slots__ = (
        "_blocks",
        "_count",
        "_decodings",
        "_last",
        "_remaining",
        "ids",
        "version",
        "versions",
    )

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        n = len(ids)
        # `_remaining[i, k]`, `_blocks[i, k]`: row i's k-th sequence. float64 holding integers
        # (exact below 2**53, far above any sum here) so the sums take numpy's fast float
        # paths; room for 4 sequences per row at first, widened on demand.
        self._remaining: FloatArray = np.zeros((n, 4))
        self._blocks: FloatArray = np.zeros((n, 4))
        self._count: IntArray = np.zeros(n, dtype=np.int64)
        self._decodings: list[Decoding | None] = [None] * n  # None: never written
        # (out, S1, S2, busy) of the last horizon asked for, kept current row by row by `sync`:
        # consecutive picks mostly share a horizon (`expected_output_tokens`)
        self._last: tuple[int, FloatArray, FloatArray, BoolArray] | None = None
        # the builder change record and build number this table was synced to last (None:
        # synced by a full scan, or never)
        self.versions: RowVersions | None = None
        self.version = 0

    def sync(self, decodings: Sequence[Decoding]) -> None:
        """Rewrite the rows whose `decoding` tuple is not the one written last time."""
        old = self._decodings
        if len(decodings) != len(old):
            raise ValueError(f"{len(decodings)} decodings for a table of {len(old)} rows")
        # C-level identity scan (a comprehension costs ~3x more at 1,024 rows)
        changed = list(compress(range(len(old)), map(is_not, decodings, old)))
        if changed:
            self._rewrite(changed, [decodings[i] for i in changed])
        self.versions = None

    def sync_columns(self, candidates: ReplicaColumns) -> None:
        """`sync(candidates.decodings())`, reading only the rows the candidates' builder says
        changed since the build this table was last synced to, when it was synced to the same
        builder's columns (`RowVersions`); else the identity scan over every row.

        Rows changed after min(this table's build, the candidates' build) are a superset of
        the rows whose `decoding` can differ (a row's version only grows), also when an older
        build is re-scored (explain); each is still checked by identity."""
        versions = candidates.versions
        if versions is None or versions is not self.versions:
            self.sync(candidates.decodings())
        else:
            since = min(self.version, candidates.version)
            if versions.current > since:  # else nothing changed: no array op at all
                rows = np.flatnonzero(versions.rows > since).tolist()
                old, decoding = self._decodings, candidates.decoding
                changed = [i for i in rows if decoding(i) is not old[i]]
                if changed:
                    self._rewrite(changed, [decoding(i) for i in changed])
        self.versions, self.version = versions, candidates.version

    def _rewrite(self, changed: list[int], decodings: list[Decoding]) -> None:
        """Write `decodings[k]` into row `changed[k]`, widening the table if needed, and patch
        the last horizon's sums on those rows."""
        old = self._decodings
        widest = max(len(d) for d in decodings)
        cap = self._remaining.shape[1]
        if widest > cap:
            cap = max(widest, 2 * cap)
            for name in ("_remaining", "_blocks"):
                narrow = getattr(self, name)
                wider = np.zeros((len(old), cap))
                wider[:, : narrow.shape[1]] = narrow
                setattr(self, name, wider)
        remaining, blocks, count, last = self._remaining, self._blocks, self._count, self._last
        for i, decoding in zip(changed, decodings, strict=True):
            pad = [0] * (cap - len(decoding))
            remaining[i] = [UNKNOWN_REMAINING if rem < 0 else rem for rem, _ in decoding] + pad
            blocks[i] = [b for _, b in decoding] + pad
            count[i] = len(decoding)
            old[i] = decoding
            if last is not None:
                last[1][i], last[2][i] = shared_sums(decoding, last[0])
                last[3][i] = bool(decoding)

    def sums(self, rows: IntArray | None, out: int) -> tuple[FloatArray, FloatArray, BoolArray]:
        """(S1, S2, lists any sequence) of `rows` (None: every row) for horizon `out`; S1 and
        S2 are integers held as float64. Read-only: the next `sync` updates them in place."""
        last = self._last
        if last is None or last[0] != out:
            shared = np.minimum(self._remaining, float(out))
            last = self._last = (
                out,
                shared.sum(axis=1),
                np.einsum("ij,ij->i", shared, self._blocks),
                self._count > 0,
            )
        if rows is None:
            return last[1], last[2], last[3]
        return last[1][rows], last[2][rows], last[3][rows]


class DecodingTables:
    """A few `DecodingTable`s, one per candidate id list object (most recent first)."""

    KEEP = 4  # a router's pools: prefill, decode, colocated, and one spare

    __slots__ = ("_tables",)

    def __init__(self) -> None:
        self._tables: list[DecodingTable] = []

    def of(self, candidates: ReplicaColumns) -> DecodingTable:
        """The synced table of `candidates` (its `ids` list identifies it: the table holds a
        reference to that list, so its id is never reused while the table is kept)."""
        ids = candidates.ids
        tables = self._tables
        for k, table in enumerate(tables):
            if table.ids is ids:
                if k:
                    tables.insert(0, tables.pop(k))
                break
        else:
            table = DecodingTable(ids)
            tables.insert(0, table)
            del tables[self.KEEP :]
        table.sync_columns(candidates)
        return table
