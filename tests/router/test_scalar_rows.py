"""Small pools route on plain snapshots (`scalar_rows`, proxy-7) exactly as on `ReplicaColumns`.

The same seeded event stream (admissions with shared prefixes, prefill successes and failures,
tokens, retries, finishes, health changes) runs through two lifecycles: one as shipped (pools of
at most `SCALAR_ROWS` members get `scalar_rows`), one forced onto the columns. Every plan, and
every decision `route(commit=False)` explains (chosen, scores, rejections, reason, details, the
P/D decision), must be the same, and so must the token load after each event.
"""

from __future__ import annotations

import random
from dataclasses import asdict

import pytest

from router.approx_index import ApproxKvIndex
from router.kv_index import KvIndex
from router.lifecycle import RequestLifecycle
from router.pd_decision import PdDecisionParams
from router.pd_router import NoReplicaError, PdRoute, PdRouter
from router.policies.config import PolicyConfig, RouterPolicyConfig
from router.replica_columns import SCALAR_ROWS, ColumnBuilder, ReplicaColumns, scalar_rows
from router.replica_state import PolicyDecision, ReplicaStatic, RoutingRequest
from router.token_load import TokenLoad
from router.vocabulary import PoolName

BS = 16
POLICIES = [("token_load", "token_load_decode"), ("dynamo", "dynamo"), ("llmd", "kv_overlap")]


def _fleet(seed: int, prefill: str, decode: str, rows: int = SCALAR_ROWS) -> RequestLifecycle:
    rng = random.Random(seed)
    config = RouterPolicyConfig(
        prefill=PolicyConfig(name=prefill),
        decode=PolicyConfig(name=decode),
        pd=PdDecisionParams(min_uncached_tokens=rng.choice([0, 64]), max_prefill_queue_s=0.05),
    )
    lc = RequestLifecycle(
        PdRouter(config, seed=seed),
        TokenLoad(),
        KvIndex("m", BS),
        ApproxKvIndex(),
        scalar_rows=rows,
    )
    sizes = (rng.randint(1, SCALAR_ROWS), rng.randint(1, SCALAR_ROWS), rng.choice([0, 0, 2]))
    pools = (PoolName.PREFILL, PoolName.DECODE, PoolName.COLOCATED)
    for pool, n, tag in zip(pools, sizes, "pdc", strict=True):
        for i in range(n):
            static = ReplicaStatic(True, rng.choice([None, 9_000.0, 20_000.0]))
            lc.add_replica(f"{tag}{i}", pool, static, approximate=True)
    return lc


def _same_decision(a: PolicyDecision | None, b: PolicyDecision | None) -> None:
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    assert (a.chosen, a.scores, a.rejected, a.reason) == (b.chosen, b.scores, b.rejected, b.reason)
    assert a.details == b.details


def _same_route(a: PdRoute, b: PdRoute) -> None:
    assert (a.kind, a.prefill_replica, a.decode_replica) == (
        b.kind,
        b.prefill_replica,
        b.decode_replica,
    )
    assert (asdict(a.pd) if a.pd else None) == (asdict(b.pd) if b.pd else None)
    _same_decision(a.prefill, b.prefill)
    _same_decision(a.decode, b.decode)


def _run(seed: int, prefill: str, decode: str, rows: int = SCALAR_ROWS) -> list[object]:
    """The event stream's outputs: plans, explained routes, loads after each step."""
    lc = _fleet(seed, prefill, decode, rows)
    rng = random.Random(seed * 7 + 1)
    out: list[object] = []
    live: list[str] = []
    ids = lc.pools.ids()
    for i in range(150):
        now = 0.01 * i
        roll = rng.random()
        if roll < 0.45 or not live:
            prompt = rng.choice([20, 200, 700, 3000])
            keys = list(range(rng.choice([1, 50, 900]), rng.choice([1, 50, 900]) + prompt // BS))
            request = RoutingRequest(f"r{i}", prompt, BS, keys, max_tokens=rng.choice([None, 64]))
            try:
                out.append(lc.route(request, now, commit=False).route)
                out.append(lc.admit(request, now))
                live.append(request.request_id)
            except NoReplicaError as e:  # every replica it could use is unhealthy
                out.append(str(e))
        elif roll < 0.6:
            out.append(lc.prefill_done(rng.choice(live), now, ok=rng.random() < 0.8))
        elif roll < 0.72:
            lc.tokens(rng.choice(live), now, rng.randrange(1, 200))
        elif roll < 0.8:
            rid = rng.choice(live)
            lc.decode_failed(rid, now, reached=rng.random() < 0.5)
            out.append(lc.retry_decode(rid, now))
        elif roll < 0.95:
            lc.finished(live.pop(rng.randrange(len(live))), now)
        else:
            lc.set_static(rng.choice(ids), ReplicaStatic(rng.random() < 0.6, 12_000.0))
        out.append({rid: lc.token_load.tracked_load(rid) for rid in ids})
    return out


@pytest.mark.parametrize("policies", POLICIES, ids=lambda p: "/".join(p))
@pytest.mark.parametrize("seed", range(6))
def test_small_pools_route_on_snapshots_as_on_columns(policies: tuple[str, str], seed: int) -> None:
    scalar = _run(seed, *policies)
    columns = _run(seed, *policies, rows=-1)  # every pool on the columns
    assert len(scalar) == len(columns)
    for a, b in zip(scalar, columns, strict=True):
        if isinstance(a, PdRoute):
            assert isinstance(b, PdRoute)
            _same_route(a, b)
        else:
            assert a == b


def test_scalar_rows_are_the_columns_snapshots_with_exclusions() -> None:
    lc = _fleet(3, "token_load", "token_load_decode")
    members = lc.pools.members(PoolName.PREFILL)
    lookup = lc.lookup([1, 2, 3], 0.0)
    statics = lc.pools.statics()
    gone = members[:1]
    rows = scalar_rows(members, lookup.overlap, lc.token_load, 0.0, statics, {}, gone)
    columns = ColumnBuilder().build(members, lookup.overlap, lc.token_load, 0.0, statics, {})
    columns.mark_unhealthy(gone)
    assert rows == list(columns)
    assert not rows[0].healthy
    assert scalar_rows([], lookup.overlap, lc.token_load, 0.0) == []
    # a pool past the bound still gets columns
    assert isinstance(lc.snapshots(PoolName.PREFILL, lookup, 0.0), list)
    for i in range(SCALAR_ROWS + 1):
        lc.add_replica(f"p-big{i}", PoolName.PREFILL)
    assert isinstance(lc.snapshots(PoolName.PREFILL, lookup, 0.0), ReplicaColumns)
