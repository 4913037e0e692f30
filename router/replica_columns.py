"""Candidate replicas as columns: the same inputs as a list of `ReplicaSnapshot`, one array
per field, so a decision over hundreds of replicas is a few array operations, not a Python
object per replica (issue 15: at 256 and 1,024 replicas the per-replica snapshot, score dict
and terms row were most of the decision).

`ReplicaColumns` *is* a `Sequence[ReplicaSnapshot]`: every caller and every routing part that
reads snapshots keeps working (the snapshots are built on first access, once, exactly as
`build_snapshots` builds them). Parts that know columns (`health`, `token_load`, `max_score`,
`decide_pd`; see `Profile.pick`) read the arrays instead and give the same answer, bit for bit:
the same IEEE-754 operations in the same order on the same values (tests/router/
test_replica_columns.py runs both paths over seeded fleets and compares every decision).

`ColumnBuilder.build(replica_ids, overlap, loads, now, static, cached_blocks)` takes
`build_snapshots`' arguments. It keeps the previous call's rows and rewrites only the rows
whose `ReplicaLoad` (a `TokenLoad` returns the same object until the replica's load changes)
or `ReplicaStatic` object changed. A load source with a change log (`TokenLoad.changes_since`)
is asked only for the replicas it says changed since the last build; any other is asked for
every replica (one identity check each). Statics, when given, are checked by identity per
replica. Then a decision costs the changed rows, the overlap row, and a copy of the arrays
(each `ReplicaColumns` owns its arrays: one kept for explain stays true).
This relies on what `TokenLoad` and `ReplicaStatic` guarantee: a load or static object is
never changed in place (a change is a new object).

Columns (index `i` = position in `replica_ids`): `ints[f, i]` for the integer fields
`INT_FIELDS`, `kv_usage`, `tps` (`prefill_tokens_per_s`, 0.0 where None: every reader treats
0 and None alike, `tps or default`), `kv_cost` (`decode_s_per_kv_token`, 0.0 where None, read
the same way), `healthy`. Read-only by convention, like a snapshot;
`mark_unhealthy` is the one change (the lifecycle's excluded and ineligible replicas).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol, overload, runtime_checkable

import numpy as np
import numpy.typing as npt

from router.replica_bitmap import PrefixDepths
from router.replica_state import (
    LoadSource,
    ReplicaLoad,
    ReplicaSnapshot,
    ReplicaStatic,
    build_snapshots,
)

INT_FIELDS = (
    "overlap_blocks",
    "prefill_tokens_queued",
    "decode_blocks",
    "num_running",
    "num_waiting",
    "kv_capacity_blocks",
    "requests_in_flight",
    "cached_blocks",
)
_ROW = {name: i for i, name in enumerate(INT_FIELDS)}
_OVERLAP = _ROW["overlap_blocks"]
_CACHED = _ROW["cached_blocks"]
_DEFAULT_STATIC = ReplicaStatic()
# Placeholders of a fresh row, distinct objects from anything a source or mapping returns, so
# the identity checks in `build` refresh every row on its first build.
_UNREAD_LOAD = ReplicaLoad()
_UNREAD_STATIC = ReplicaStatic()

SCALAR_ROWS = 8
"""At most this many candidates, the routing parts run Python arithmetic on the columns'
values (or on the snapshots) instead of numpy: a numpy call costs 1-3 µs whatever its length,
more than the loop over a handful of rows (`Profile.pick`, `TokenLoadScorer.score_columns`,
`decide_pd`; proxy.md, proxy-cpu-4). One constant for every part; `scalar_rows` (no columns
at all) below it (proxy-7)."""


@runtime_checkable
class ChangeLog(Protocol):
    """A load source that says which replicas' loads changed (`TokenLoad` does)."""

    def changes_since(self, position: int) -> tuple[int, list[str]] | None: ...

    def change_position(self) -> int: ...


IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class RowVersions:
    """Which rows a `ColumnBuilder`'s builds changed: `rows[i]` is the number of the last build
    that gave row `i` a new `ReplicaLoad` object, `current` the last build's number. A reader
    that synced to build `g` need only re-read the rows with `rows > g` (the straggler term's
    `DecodingTable`: an O(replicas) identity scan per pick cost 1,024-replica decisions
    ~120 µs, router-straggler-vec). One object per builder reset (so per `ids` list); only
    ever increases, so a reader of an older build re-reads a superset of what changed."""

    __slots__ = ("current", "rows")

    def __init__(self, n: int) -> None:
        self.rows: IntArray = np.zeros(n, dtype=np.int64)
        self.current = 0


# an empty pool's columns: zero-length arrays, nothing can be written into them, so shared
_EMPTY_INTS: IntArray = np.zeros((len(INT_FIELDS), 0), dtype=np.int64)
_EMPTY_FLOATS: FloatArray = np.zeros(0)
_EMPTY_BOOLS: BoolArray = np.zeros(0, dtype=np.bool_)


class ReplicaColumns(Sequence[ReplicaSnapshot]):
    """Candidates as arrays (module docstring); a lazy `Sequence[ReplicaSnapshot]` too."""

    __slots__ = (
        "_loads",
        "_snapshots",
        "_statics",
        "healthy",
        "ids",
        "ints",
        "kv_cost",
        "kv_usage",
        "tps",
        "version",
        "versions",
    )

    def __init__(
        self,
        ids: list[str],
        ints: IntArray,
        kv_usage: FloatArray,
        tps: FloatArray,
        healthy: BoolArray,
        loads: list[ReplicaLoad],
        statics: list[ReplicaStatic],
        kv_cost: FloatArray | None = None,
        versions: RowVersions | None = None,
        version: int = 0,
    ) -> None:
        self.ids = ids
        self.ints = ints
        self.kv_usage = kv_usage
        self.tps = tps
        self.kv_cost = kv_cost if kv_cost is not None else np.zeros(len(ids))
        self.healthy = healthy
        self._loads = loads
        self._statics = statics
        self._snapshots: list[ReplicaSnapshot] | None = None
        # the builder's change record and this build's number in it (None: not from a builder)
        self.versions = versions
        self.version = version

    @classmethod
    def of(cls, snapshots: Sequence[ReplicaSnapshot]) -> ReplicaColumns:
        """Columns of existing snapshots (which stay the sequence's items, shared)."""
        snaps = list(snapshots)
        n = len(snaps)
        ints = np.zeros((len(INT_FIELDS), n), dtype=np.int64)
        for f, name in enumerate(INT_FIELDS):
            ints[f] = [getattr(s, name) for s in snaps]
        columns = cls(
            [s.replica_id for s in snaps],
            ints,
            np.array([s.kv_usage for s in snaps], dtype=np.float64),
            np.array([s.prefill_tokens_per_s or 0.0 for s in snaps], dtype=np.float64),
            np.array([s.healthy for s in snaps], dtype=np.bool_),
            [],
            [],
            np.array([s.decode_s_per_kv_token or 0.0 for s in snaps], dtype=np.float64),
        )
        columns._snapshots = snaps
        return columns

    def decoding(self, index: int) -> tuple[tuple[int, int], ...]:
        """Row `index`'s `ReplicaSnapshot.decoding` (remaining output, decode blocks per
        decoding sequence), without building the snapshots."""
        if self._snapshots is not None:
            return self._snapshots[index].decoding
        return self._loads[index].decoding

    def decodings(self) -> list[tuple[tuple[int, int], ...]]:
        """Every row's `decoding` (the straggler-aware term's table syncs on these tuples'
        identity: a `TokenLoad` keeps one until the replica's load changes)."""
        if self._snapshots is not None:
            return [s.decoding for s in self._snapshots]
        return [load.decoding for load in self._loads]

    def column(self, name: str) -> IntArray | FloatArray | BoolArray | None:
        """The array of a numeric `ReplicaSnapshot` field (None: not a column)."""
        row = _ROW.get(name)
        if row is not None:
            values: IntArray = self.ints[row]
            return values
        if name == "kv_usage":
            return self.kv_usage
        if name == "healthy":
            return self.healthy
        return None

    @property
    def overlap(self) -> IntArray:
        values: IntArray = self.ints[_OVERLAP]
        return values

    def overlap_of(self, replica_id: str) -> int:
        """The replica's overlap (0 when it is not a candidate)."""
        try:
            return int(self.ints[_OVERLAP, self.ids.index(replica_id)])
        except ValueError:
            return 0

    def mark_unhealthy(self, replica_ids: Iterable[str]) -> None:
        """Mark these candidates unhealthy (ids that are not candidates are ignored)."""
        wanted = set(replica_ids)
        if not wanted:
            return
        for i, rid in enumerate(self.ids):
            if rid in wanted:
                self.healthy[i] = False
                if self._snapshots is not None:
                    self._snapshots[i].healthy = False

    # -- the Sequence[ReplicaSnapshot] view --------------------------------------------------

    def snapshots(self) -> list[ReplicaSnapshot]:
        """The candidates as `build_snapshots` returns them (built once, then shared)."""
        snaps = self._snapshots
        if snaps is None:
            healthy = self.healthy.tolist()
            overlap = self.ints[_OVERLAP].tolist()
            cached = self.ints[_CACHED].tolist()
            snaps = self._snapshots = [
                ReplicaSnapshot(
                    rid,
                    healthy[i],
                    overlap[i],
                    load.prefill_tokens_queued,
                    load.decode_blocks,
                    load.kv_usage,
                    load.num_running,
                    load.num_waiting,
                    load.kv_capacity_blocks,
                    load.requests_in_flight,
                    info.prefill_tokens_per_s,
                    cached[i],
                    None,
                    load.decoding,
                    info.decode_s_per_kv_token,
                    info.latency,
                )
                for i, (rid, load, info) in enumerate(
                    zip(self.ids, self._loads, self._statics, strict=True)
                )
            ]
        return snaps

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> ReplicaSnapshot: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[ReplicaSnapshot]: ...

    def __getitem__(self, index: int | slice) -> ReplicaSnapshot | Sequence[ReplicaSnapshot]:
        return self.snapshots()[index]

    def __iter__(self) -> Iterator[ReplicaSnapshot]:
        return iter(self.snapshots())


def overlap_of(candidates: Sequence[ReplicaSnapshot], replica_id: str) -> int:
    """`replica_id`'s overlap among `candidates` (0 if absent), without building snapshots
    when they are columns."""
    if isinstance(candidates, ReplicaColumns):
        return candidates.overlap_of(replica_id)
    return next((s.overlap_blocks for s in candidates if s.replica_id == replica_id), 0)


def scalar_rows(
    replica_ids: Sequence[str],
    overlap: Mapping[str, int],
    loads: LoadSource,
    now: float,
    static: Mapping[str, ReplicaStatic] | None = None,
    cached_blocks: Mapping[str, int] | None = None,
    exclude: Iterable[str] = (),
) -> list[ReplicaSnapshot]:
    """A small pool's candidates as plain snapshots, no arrays (`ReplicaPools.snapshots` below
    `SCALAR_ROWS` members): `build_snapshots` with the `exclude`d ones marked unhealthy, as
    `ColumnBuilder.build` + `ReplicaColumns.mark_unhealthy` give them.

    Why: every routing part reads at most `SCALAR_ROWS` candidates as snapshots anyway
    (`Profile.pick`, `decide_pd`), so the columns were built only to be turned back into
    snapshots: 3 builds per request, ~4 µs each plus the snapshots, against ~0.5 µs per
    snapshot here (a 1P1D fleet's admit; proxy.md, proxy-7). Values are the same objects'
    fields, so the decisions are the same (tests/router/test_replica_columns.py)."""
    if not replica_ids:
        return []
    snaps = build_snapshots(replica_ids, overlap, loads, now, static, cached_blocks)
    if exclude:
        wanted = set(exclude)
        for snap in snaps:
            if snap.replica_id in wanted:
                snap.healthy = False
    return snaps


class ColumnBuilder:
    """Builds `ReplicaColumns`, rewriting only the rows whose load or statics changed."""

    __slots__ = (
        "_all_default",
        "_change_log",
        "_gather",
        "_gather_token",
        "_healthy",
        "_ids",
        "_ints",
        "_kv_cost",
        "_kv_usage",
        "_loads",
        "_position",
        "_row_of",
        "_source",
        "_statics",
        "_tps",
        "_versions",
    )

    def __init__(self) -> None:
        self._ids: list[str] = []
        self._source: LoadSource | None = None
        self._ints: IntArray = np.zeros((len(INT_FIELDS), 0), dtype=np.int64)
        self._kv_usage: FloatArray = np.zeros(0)
        self._tps: FloatArray = np.zeros(0)
        self._kv_cost: FloatArray = np.zeros(0)
        self._healthy: BoolArray = np.zeros(0, dtype=np.bool_)
        self._loads: list[ReplicaLoad] = []
        self._statics: list[ReplicaStatic] = []
        self._change_log: ChangeLog | None = None
        self._row_of: dict[str, int] = {}
        self._position = -1  # the load source's change-log position read last (-1: none)
        self._all_default = False  # every row's statics are the default (no mapping given)
        # `PrefixDepths` overlap: the candidates' bit indexes, for one layout token
        self._gather: npt.NDArray[np.intp] = np.zeros(0, dtype=np.intp)
        self._gather_token = 0
        self._versions = RowVersions(0)

    def _reset(self, ids: list[str], loads: LoadSource) -> None:
        n = len(ids)
        self._ids = ids
        self._source = loads
        self._ints = np.zeros((len(INT_FIELDS), n), dtype=np.int64)
        self._kv_usage = np.zeros(n)
        self._tps = np.zeros(n)
        self._kv_cost = np.zeros(n)
        self._healthy = np.ones(n, dtype=np.bool_)
        self._loads = [_UNREAD_LOAD] * n
        self._statics = [_UNREAD_STATIC] * n
        # checked once per source, not per build (a protocol isinstance costs microseconds)
        self._change_log = loads if isinstance(loads, ChangeLog) else None
        self._row_of = {rid: i for i, rid in enumerate(ids)}
        self._position = -1
        self._all_default = False
        self._gather_token = 0
        self._versions = RowVersions(n)

    def _changed_rows(self) -> list[int] | None:
        """Rows whose load may have changed since the last build (None: all of them)."""
        log = self._change_log
        if log is None:
            return None
        answer = log.changes_since(self._position)
        if answer is None:
            self._position = log.change_position()
            return None
        self._position, replica_ids = answer
        if len(replica_ids) > len(self._ids):
            return None  # cheaper to re-read every row
        row_of = self._row_of
        return sorted({row_of[rid] for rid in replica_ids if rid in row_of})

    def build(
        self,
        replica_ids: Iterable[str],
        overlap: Mapping[str, int],
        loads: LoadSource,
        now: float,
        static: Mapping[str, ReplicaStatic] | None = None,
        cached_blocks: Mapping[str, int] | None = None,
    ) -> ReplicaColumns:
        """`build_snapshots(...)` as columns (same arguments, same meaning)."""
        ids = replica_ids if isinstance(replica_ids, list) else list(replica_ids)
        if not ids:  # an empty pool (the colocated one of a P/D fleet): nothing to build
            return ReplicaColumns(
                [], _EMPTY_INTS, _EMPTY_FLOATS, _EMPTY_FLOATS, _EMPTY_BOOLS, [], [], _EMPTY_FLOATS
            )
        if ids != self._ids or loads is not self._source:
            self._reset(list(ids), loads)
        ids = self._ids  # our copy: the caller's list may change after this call
        ints, kv_usage, tps, healthy = self._ints, self._kv_usage, self._tps, self._healthy
        kv_cost = self._kv_cost
        prev_loads, prev_statics = self._loads, self._statics
        get_load = loads.load
        changed = self._changed_rows()
        rows: Iterable[int] = range(len(ids)) if changed is None else changed
        versions = self._versions
        version = versions.current = versions.current + 1
        row_versions = versions.rows
        for i in rows:
            load = get_load(ids[i], now)
            if load is not prev_loads[i]:
                prev_loads[i] = load
                row_versions[i] = version
                ints[1:7, i] = (
                    load.prefill_tokens_queued,
                    load.decode_blocks,
                    load.num_running,
                    load.num_waiting,
                    load.kv_capacity_blocks,
                    load.requests_in_flight,
                )
                kv_usage[i] = load.kv_usage
        # statics are a plain mapping (changed in place by their owner): checked every time,
        # by identity (a `ReplicaStatic` is frozen), only when there are any
        if static or not self._all_default:
            self._all_default = not static
            get_static = (static or {}).get
            for i, rid in enumerate(ids):
                info = get_static(rid, _DEFAULT_STATIC)
                if info is not prev_statics[i]:
                    prev_statics[i] = info
                    healthy[i] = info.healthy
                    tps[i] = info.prefill_tokens_per_s or 0.0
                    kv_cost[i] = info.decode_s_per_kv_token or 0.0
        out_ints = ints.copy()
        row = out_ints[_OVERLAP]
        # depths by replica bit (`KvIndex.overlap`): one gather, rows cached per bit layout;
        # else one list, then one conversion: a numpy item assignment per replica costs more
        if isinstance(overlap, PrefixDepths):
            layout = overlap.layout
            if layout.token != self._gather_token:
                self._gather = layout.rows(ids)
                self._gather_token = layout.token
            np.take(overlap.array, self._gather, out=row)
        elif overlap:
            get_overlap = overlap.get
            row[:] = [get_overlap(rid, 0) for rid in ids]
        else:
            row[:] = 0
        row = out_ints[_CACHED]
        if cached_blocks:
            get_cached = cached_blocks.get
            row[:] = [get_cached(rid, 0) for rid in ids]
        else:
            row[:] = 0
        return ReplicaColumns(
            ids,
            out_ints,
            kv_usage.copy(),
            tps.copy(),
            healthy.copy(),
            prev_loads.copy(),
            prev_statics.copy(),
            kv_cost.copy(),
            versions,
            version,
        )
