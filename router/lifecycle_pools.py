"""`ReplicaPools`: who `RequestLifecycle` (router/lifecycle.py) routes among, and what the KV
indexes say they hold.

Membership and per-replica statics (health, profiled throughput) are data the caller hands
in: the coordinator from its fleet events, the fleet simulator from its `FleetSpec`. Members
are kept in natural order (`p2` before `p10`), the order policies break ties in, so a fleet
of `prefill-0..prefill-11` reads the same in both callers.

`lookup` joins the precise index (KV events) and, for replicas that publish none, the
approximate one (what we routed to them within its TTL): a replica's overlap is the larger of
the two (only approximate replicas read the approximate index), and its `cached_blocks` come
from the index that describes it.

`snapshots` returns `ReplicaColumns` (`router/replica_columns.py`), one `ColumnBuilder` per
pool, so a decision re-reads only the replicas whose load changed and the `token_load`
profile and the P/D decision run on arrays (issue 15); other policies read them as snapshots.
A pool of at most `SCALAR_ROWS` members gets plain snapshots (`scalar_rows`, proxy-7): every
part reads so few candidates as snapshots, so the arrays were pure overhead there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from router.lifecycle_plan import KvLookup
from router.replica_columns import SCALAR_ROWS, ColumnBuilder, scalar_rows
from router.replica_state import LoadSource, ReplicaSnapshot, ReplicaStatic
from router.vocabulary import PoolName

DEFAULT_STATIC = ReplicaStatic()
_DIGITS = re.compile(r"(\d+)")


class PreciseIndex(Protocol):
    """What the lifecycle reads of a KV-event-fed index (`router.kv_index.KvIndex`)."""

    def match(self, keys: Sequence[int]) -> dict[str, int]: ...

    def overlap(self, keys: Sequence[int]) -> Mapping[str, int]: ...

    def blocks(self, replica_id: str) -> int: ...


class ApproximateIndex(Protocol):
    """What it reads and writes of a routed-prefix index (`router.approx_index.ApproxKvIndex`)."""

    def match(self, keys: Sequence[int], now: float) -> dict[str, int]: ...

    def blocks(self, replica_id: str) -> int: ...

    def record(self, replica_id: str, keys: Sequence[int], now: float) -> None: ...


def natural_key(replica_id: str) -> tuple[tuple[int, str], ...]:
    """Sort key comparing digit runs as numbers (`d2` < `d10`)."""
    return tuple((int(p), "") if p.isdigit() else (0, p) for p in _DIGITS.split(replica_id))


class ReplicaPools:
    """Pool members, their statics and the index lookups (module docstring)."""

    def __init__(
        self,
        index: PreciseIndex,
        approx: ApproximateIndex | None = None,
        scalar_rows: int = SCALAR_ROWS,
    ) -> None:
        """`scalar_rows`: pools of at most this many members get plain snapshots (module
        docstring; default `SCALAR_ROWS`, 8; -1 puts every pool on the columns)."""
        self.index = index
        self.scalar_rows = scalar_rows
        self.approx = approx
        self._pools: dict[PoolName, list[str]] = {pool: [] for pool in PoolName}
        self._pool_of: dict[str, PoolName] = {}
        self._static: dict[str, ReplicaStatic] = {}
        self._approximate: set[str] = set()
        self._columns: dict[PoolName, ColumnBuilder] = {pool: ColumnBuilder() for pool in PoolName}

    def add(
        self, replica_id: str, pool: PoolName, static: ReplicaStatic, approximate: bool
    ) -> None:
        old = self._pool_of.get(replica_id)
        if old is not None and old is not pool:
            self._pools[old].remove(replica_id)
        members = self._pools[pool]
        if replica_id not in members:
            members.append(replica_id)
            members.sort(key=natural_key)
        self._pool_of[replica_id] = pool
        self._static[replica_id] = static
        if approximate:
            self._approximate.add(replica_id)
        else:
            self._approximate.discard(replica_id)

    def set_static(self, replica_id: str, static: ReplicaStatic) -> None:
        if replica_id in self._pool_of:
            self._static[replica_id] = static

    def remove(self, replica_id: str) -> None:
        pool = self._pool_of.pop(replica_id, None)
        if pool is not None:
            self._pools[pool].remove(replica_id)
        self._static.pop(replica_id, None)
        self._approximate.discard(replica_id)

    def members(self, pool: PoolName) -> list[str]:
        return self._pools[pool]

    def ids(self) -> list[str]:
        """Every member, in natural order."""
        return sorted(self._pool_of, key=natural_key)

    def is_approximate(self, replica_id: str) -> bool:
        return replica_id in self._approximate

    def static(self, replica_id: str) -> ReplicaStatic:
        return self._static.get(replica_id, DEFAULT_STATIC)

    def statics(self) -> dict[str, ReplicaStatic]:
        return dict(self._static)

    def lookup(self, keys: Sequence[int], now: float) -> KvLookup:
        approx = self.approx
        approximate = self._approximate
        # the index's depths as they are (an array `ColumnBuilder` gathers), unless approximate
        # replicas' matches must be merged in: then a plain dict
        overlap: Mapping[str, int] = self.index.overlap(keys) if keys else {}
        if approx is not None and approximate and keys:
            merged = dict(overlap)
            for rid, blocks in approx.match(keys, now).items():
                if rid in approximate and blocks > merged.get(rid, 0):
                    merged[rid] = blocks
            overlap = merged
        cached: dict[str, int] = {}
        for rid in self._pool_of:
            if approx is not None and rid in approximate:
                cached[rid] = approx.blocks(rid)
            else:
                cached[rid] = self.index.blocks(rid)
        return KvLookup(overlap, cached)

    def snapshots(
        self,
        pool: PoolName,
        lookup: KvLookup,
        loads: LoadSource,
        now: float,
        exclude: Iterable[str] = (),
    ) -> Sequence[ReplicaSnapshot]:
        """Candidates of `pool` (unhealthy and excluded ones included, marked unhealthy, so
        explain shows them): `ReplicaColumns`, or plain snapshots for a pool of at most
        `self.scalar_rows` members (`scalar_rows`: the routing parts read those as snapshots)."""
        members = self._pools[pool]
        if len(members) <= self.scalar_rows:
            return scalar_rows(
                members, lookup.overlap, loads, now, self._static, lookup.cached_blocks, exclude
            )
        columns = self._columns[pool].build(
            self._pools[pool], lookup.overlap, loads, now, self._static, lookup.cached_blocks
        )
        columns.mark_unhealthy(exclude)
        return columns

    def record_routed(self, replica_id: str, keys: Sequence[int], now: float) -> None:
        """`replica_id` will hold `keys`: remember it where no KV events will say so."""
        if self.approx is not None and replica_id in self._approximate and keys:
            self.approx.record(replica_id, keys, now)
