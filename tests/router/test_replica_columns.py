"""The column path decides exactly as the snapshot path (issue 15: routing at 256-1,024
replicas). Seeded fleets with real `TokenLoad` state (admissions, prefills, tokens, scrapes),
statics (unhealthy replicas, profiled throughput given as int, float or None) and overlaps
drawn with many exact ties; every decision is compared whole: chosen replica, scores,
rejections, reason, details and the P/D decision. The recorded golden decisions run through
columns too (`tests/router/test_decision_replay.py`).
"""

from __future__ import annotations

import random
from dataclasses import asdict

import numpy as np
import pytest

from router.kv_events import BlockStored, EngineBlockHash
from router.kv_index import KvIndex
from router.pd_decision import PdDecisionParams, decide_pd
from router.pd_router import PdRouter
from router.plugins.scorers.token_load import TokenLoadParams, TokenLoadScorer
from router.policies.config import PolicyConfig, RouterPolicyConfig, build_policy
from router.replica_columns import ColumnBuilder, ReplicaColumns
from router.replica_state import (
    PolicyDecision,
    ReplicaStatic,
    RoutingRequest,
    build_snapshots,
)
from router.token_load import CHANGE_WINDOW, TokenLoad

BS = 16


def _fleet(rng: random.Random, n: int) -> tuple[list[str], TokenLoad, dict[str, ReplicaStatic]]:
    ids = [f"r{i}" for i in range(n)]
    load = TokenLoad()
    for rid in ids:
        for j in range(rng.choice([0, 0, 1, 3])):
            prompt = rng.randrange(16, 6000)
            load.on_admitted(
                f"{rid}-{j}",
                rid,
                0.0,
                prompt_tokens=prompt,
                uncached_tokens=rng.randrange(0, prompt),
                block_size=BS,
                max_tokens=rng.choice([None, 64, 900]),
            )
            if rng.random() < 0.5:
                load.on_prefill_done(f"{rid}-{j}", rid, 0.0)
        if rng.random() < 0.7:
            load.observe_metrics(
                rid,
                0.5,
                num_running=rng.randrange(0, 6),
                num_waiting=rng.randrange(0, 3),
                kv_usage=rng.choice([0.0, rng.random()]),
                kv_capacity_blocks=rng.choice([0, 40, 30_000]),
            )
    tps_choices: list[float | None] = [None, None, 12_000.0, 0.0, 9000]  # 9000: an int
    static = {
        rid: ReplicaStatic(rng.random() > 0.1, rng.choice(tps_choices))
        for rid in ids
        if rng.random() < 0.6
    }
    return ids, load, static


def _request(rng: random.Random, i: int) -> RoutingRequest:
    prompt = rng.choice([0, 100, 600, 1024, 4000, 8192])
    return RoutingRequest(
        f"q{i}",
        prompt,
        BS,
        tuple(range(prompt // BS)),
        max_tokens=rng.choice([None, 1, 100, 5000]),
    )


def _overlap(rng: random.Random, ids: list[str], request: RoutingRequest) -> dict[str, int]:
    blocks = request.prompt_blocks
    depths = [0, blocks, blocks // 2] if blocks else [0]  # few values: many exact ties
    return {rid: d for rid in ids if (d := rng.choice(depths))}


def _same(a: PolicyDecision, b: PolicyDecision) -> None:
    assert (a.chosen, a.scores, a.rejected, a.higher_is_better) == (
        b.chosen,
        b.scores,
        b.rejected,
        b.higher_is_better,
    )
    assert a.reason == b.reason
    assert a.details == b.details


PROFILES = [
    {"name": "token_load"},
    {
        "name": "token_load",
        "params": {"max_num_batched_tokens": 300, "decode_s_per_kv_token": 3e-6},
    },
    {"name": "token_load", "params": {"remaining_decode": False, "per_replica_decode_cost": False}},
    {"name": "token_load", "params": {"remaining_decode": True, "peer_weight": 0.5}},
    {"name": "token_load_decode"},
    {"name": "dynamo"},
    {"name": "llmd"},
    {"name": "kv_overlap"},
]


@pytest.mark.parametrize("config", PROFILES, ids=lambda c: str(c))
@pytest.mark.parametrize("replicas", [1, 7, 256])
def test_columns_decide_as_snapshots(config: dict[str, object], replicas: int) -> None:
    rng = random.Random(replicas * 31 + len(str(config)))
    ids, load, static = _fleet(rng, replicas)
    old = build_policy(PolicyConfig.model_validate(config))
    new = build_policy(PolicyConfig.model_validate(config))
    builder = ColumnBuilder()
    params = PdDecisionParams(max_prefill_queue_s=0.3)
    for i in range(60):
        now = 1.0 + i
        request = _request(rng, i)
        overlap = _overlap(rng, ids, request)
        cached = {rid: rng.randrange(0, 50) for rid in ids if rng.random() < 0.5}
        snaps = build_snapshots(ids, overlap, load, now, static, cached)
        columns = builder.build(ids, overlap, load, now, static, cached)
        if i % 5 == 4:
            gone = rng.sample(ids, max(1, replicas // 3))
            for s in snaps:
                if s.replica_id in gone:
                    s.healthy = False
            columns.mark_unhealthy(gone)
        before = len(snaps)
        _same(old.pick(request, snaps, now), new.pick(request, columns, now))
        assert asdict(decide_pd(request, snaps, params, now)) == asdict(
            decide_pd(request, columns, params, now)
        )
        assert list(columns) == snaps and len(snaps) == before  # the snapshot view, too
        # the fleet moves on: the builder must pick up exactly the rows that changed
        for rid in rng.sample(ids, max(1, replicas // 10)):
            load.on_admitted(
                f"new-{i}-{rid}", rid, now, prompt_tokens=700, uncached_tokens=300, block_size=BS
            )
        if rng.random() < 0.3:
            rid = rng.choice(ids)
            static[rid] = ReplicaStatic(rng.random() > 0.5, rng.choice([None, 20_000.0]))
        if rng.random() < 0.3:
            load.on_finished(f"new-{i}-{ids[0]}", now)


def test_token_load_profile_takes_the_column_path() -> None:
    """The default prefill profile runs on the arrays (no snapshot is built)."""
    rng = random.Random(5)
    ids, load, static = _fleet(rng, 64)
    request = _request(rng, 0)
    columns = ColumnBuilder().build(ids, _overlap(rng, ids, request), load, 1.0, static)
    policy = build_policy(PolicyConfig(name="token_load"))
    assert policy.columnar
    policy.pick(request, columns, 1.0)
    decide_pd(request, columns, PdDecisionParams(), 1.0)
    assert columns._snapshots is None  # no snapshot was built
    assert not build_policy(PolicyConfig(name="dynamo")).columnar


def test_pd_router_routes_columns_as_snapshots() -> None:
    rng = random.Random(11)
    config = RouterPolicyConfig(prefill=PolicyConfig(name="token_load"))
    old, new = PdRouter(config, seed=3), PdRouter(config, seed=3)
    p_ids, load, static = _fleet(rng, 40)
    d_ids = [f"d{i}" for i in range(12)]
    for i in range(80):
        request = _request(rng, i)
        overlap = _overlap(rng, p_ids + d_ids, request)
        a = old.route(
            request,
            build_snapshots(p_ids, overlap, load, float(i), static),
            build_snapshots(d_ids, overlap, load, float(i)),
            float(i),
        )
        b = new.route(
            request,
            ColumnBuilder().build(p_ids, overlap, load, float(i), static),
            ReplicaColumns.of(build_snapshots(d_ids, overlap, load, float(i))),
            float(i),
        )
        assert (a.kind, a.prefill_replica, a.decode_replica, a.pd) == (
            b.kind,
            b.prefill_replica,
            b.decode_replica,
            b.pd,
        )
        if a.prefill is not None and b.prefill is not None:
            _same(a.prefill, b.prefill)


def test_builder_rereads_everything_past_the_change_window() -> None:
    """More changes between two builds than `TokenLoad` keeps: the builder re-reads every row
    and still matches `build_snapshots`."""
    rng = random.Random(2)
    ids, load, static = _fleet(rng, 30)
    builder = ColumnBuilder()
    builder.build(ids, {}, load, 1.0, static)
    for k in range(2 * CHANGE_WINDOW + 10):
        rid = ids[k % 7]
        load.on_admitted(f"w{k}", rid, 2.0, prompt_tokens=64, uncached_tokens=k % 64, block_size=BS)
    assert load.changes_since(0) is None
    columns = builder.build(ids, {"r3": 2}, load, 3.0, static)
    assert list(columns) == build_snapshots(ids, {"r3": 2}, load, 3.0, static)
    position = load.change_position()
    load.on_finished("w5", 4.0)
    assert load.changes_since(position) == (position + 1, [ids[5]])


def test_builder_gathers_prefix_depths_as_the_dict() -> None:
    """`KvIndex.overlap` answers (`PrefixDepths`, gathered by bit index) fill the overlap row
    exactly as the dict `match` returns, through replicas joining and leaving the index between
    builds (new bit layouts: the builder's cached gather is rebuilt) and candidates the index
    has never seen."""
    rng = random.Random(5)
    ids, load, static = _fleet(rng, 70)
    index = KvIndex("m", BS)
    prompt = [rng.randrange(32_000) for _ in range(40 * BS)]
    keys = index.keys_for(prompt)
    builder = ColumnBuilder()
    next_hash = 1
    for step in range(6):
        for rid in rng.sample(ids[:60], 12):  # ids[60:] never get a bit
            depth = rng.randrange(0, 41)
            index.clear_replica(rid)
            if depth:
                hashes: list[EngineBlockHash] = list(range(next_hash, next_hash + depth))
                next_hash += depth
                index.apply(rid, [BlockStored(hashes, None, prompt[: depth * BS], BS)])
        if step % 2:
            index.remove_replica(rng.choice(ids[:60]))  # frees a bit a later join reuses
        depths = index.overlap(keys)
        columns = builder.build(ids, depths, load, float(step), static)
        reference = ColumnBuilder().build(ids, index.match(keys), load, float(step), static)
        assert columns.overlap.tolist() == reference.overlap.tolist()
        assert list(columns) == list(reference)
        assert any(columns.overlap.tolist())


@pytest.mark.parametrize("replicas", [1, 2, 8, 9])
def test_token_load_few_rows_score_as_the_array_path(replicas: int) -> None:
    """At most `SCALAR_ROWS` rows `score_columns` runs the loop's arithmetic on the rows'
    values: the same scores, bit for bit, and the same terms as the array path (9: the array
    path itself), over every row and over a subset, with and without decode KV."""
    rng = random.Random(replicas)
    ids, load, static = _fleet(rng, replicas)
    scorer = TokenLoadScorer(TokenLoadParams())
    builder = ColumnBuilder()
    for i in range(40):
        request = _request(rng, i)
        columns = builder.build(ids, _overlap(rng, ids, request), load, 1.0 + i, static)
        every = np.arange(replicas, dtype=np.intp)
        for rows in (every, every[::2]):
            fast = scorer.score_columns(request, columns, rows, 1.0 + i)
            arrays = scorer._score_arrays(request, columns, rows)
            assert fast.values.dtype == np.float64
            assert fast.values.tolist() == arrays.values.tolist()
            assert fast.terms() == arrays.terms()
        load.on_admitted(
            f"n{i}", rng.choice(ids), 1.0 + i, prompt_tokens=900, uncached_tokens=500, block_size=BS
        )
