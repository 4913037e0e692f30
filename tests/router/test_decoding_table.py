"""The straggler-aware term as array operations (router/plugins/scorers/decoding_table.py):
the same scores as the per-sequence formula, on random states and on a token load that
changes between picks (sequences added, tokens streamed, finished, rows widened)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from router.plugins.scorers.decoding_table import DecodingTable, DecodingTables, shared_sums
from router.policies.config import PolicyConfig, build_policy
from router.replica_columns import ColumnBuilder, ReplicaColumns
from router.replica_state import ReplicaSnapshot, ReplicaStatic, RoutingRequest, build_snapshots
from router.token_load import TokenLoad

BS = 16


def per_sequence(
    decoding: tuple[tuple[int, int], ...],
    out: int,
    tps: float,
    c: float,
    peer_weight: float,
    prompt: int,
) -> float:
    """The term as it was written before the table (a sum over sequences, issue 15)."""
    step = 1.0 / tps
    total = 0.0
    for rem, blocks in decoding:
        shared = out if rem < 0 or rem > out else rem
        total += shared * (step + c * BS * blocks + peer_weight * step + peer_weight * c * prompt)
    return total


def _decoding(rng: random.Random) -> tuple[tuple[int, int], ...]:
    n = rng.choice([0, 0, 1, 2, 5, 9])
    rows = [(rng.choice([-1, 0, rng.randrange(1, 3000)]), rng.randrange(0, 600)) for _ in range(n)]
    return tuple(sorted(rows))


@pytest.mark.parametrize("seed", range(6))
def test_the_array_path_gives_the_per_sequence_formula(seed: int) -> None:
    rng = random.Random(seed)
    tps, c, peer_weight = rng.choice([8000.0, 12_345.0]), rng.choice([4e-8, 2.7e-8]), 0.5
    policy = build_policy(
        PolicyConfig(
            name="token_load",
            params={
                "remaining_decode": True,
                "peer_weight": peer_weight,
                "default_prefill_tokens_per_s": tps,
                "decode_s_per_kv_token": c,
                "per_replica_decode_cost": False,
            },
        )
    )
    scorer = policy.scorers[0][0]
    for n in (3, 40, 300):  # the scalar path (<= 8 rows) and the array path
        snaps = []
        for i in range(n):
            decoding = _decoding(rng)
            blocks = sum(b for _, b in decoding) + rng.choice([0, 0, 7])
            snaps.append(
                ReplicaSnapshot(
                    f"r{i}",
                    decode_blocks=blocks,
                    requests_in_flight=len(decoding),
                    decoding=decoding,
                )
            )
        columns = ReplicaColumns.of(snaps)
        for max_tokens in (None, 1, 40, 5000):
            prompt = rng.choice([16, 900, 8192])
            req = RoutingRequest("q", prompt, BS, tuple(range(prompt // BS)), max_tokens=max_tokens)
            out = 256 if max_tokens is None else min(256, max_tokens)
            got = scorer.score(req, snaps, 0.0)
            arrays = scorer.score_columns(req, columns, np.arange(n), 0.0)
            for k, s in enumerate(snaps):
                want = s.decoding and per_sequence(s.decoding, out, tps, c, peer_weight, prompt)
                decode = got.terms[s.replica_id]["decode_s"]
                if s.decoding:
                    assert decode == pytest.approx(want, rel=1e-9, abs=1e-12)
                # the paths agree bit for bit (the sums are integers; one float expression)
                assert arrays.values[k] == got.scores[s.replica_id]


def test_the_table_rewrites_only_changed_rows_and_widens() -> None:
    ids = ["a", "b", "c"]
    table = DecodingTable(ids)
    first = [((5, 10),), (), ((-1, 3), (7, 2))]
    table.sync(first)
    s1, s2, busy = table.sums(None, 6)
    assert s1.tolist() == [5, 0, 6 + 6] and s2.tolist() == [50, 0, 18 + 12]
    assert busy.tolist() == [True, False, True]
    # b gains seven sequences (past the 4 slots), a is unchanged (the same tuple object)
    wide = tuple((i, 1) for i in range(7))
    table.sync([first[0], wide, first[2]])
    s1, s2, busy = table.sums(np.array([1, 2]), 3)
    assert s1.tolist() == [0 + 1 + 2 + 3 * 4, 3 + 3] and s2.tolist() == [15, 9 + 6]
    # a finishes: its row is cleared, not left with old slots
    table.sync([(), wide, first[2]])
    assert table.sums(None, 6)[0].tolist() == [0, 21, 12]
    for out in (0, 2, 100):  # the scalar paths' sums agree
        want = [shared_sums(d, out) for d in [(), wide, first[2]]]
        s1, s2, _ = table.sums(None, out)
        assert list(zip(s1.tolist(), s2.tolist(), strict=True)) == want
    tables = DecodingTables()
    cols = ReplicaColumns.of(
        [ReplicaSnapshot(r, decoding=d) for r, d in zip(ids, first, strict=True)]
    )
    assert tables.of(cols) is tables.of(cols)  # one table per candidate list


def test_columns_follow_a_changing_token_load() -> None:
    # A fleet whose sequences are admitted, stream tokens and finish between picks: the column
    # path (its table synced on changed rows only) decides as the snapshot path every time.
    rng = random.Random(7)
    ids = [f"r{i}" for i in range(64)]
    load = TokenLoad()
    static = {rid: ReplicaStatic(True, None, rng.choice([None, 2.7e-8])) for rid in ids}
    config = PolicyConfig(name="token_load", params={"remaining_decode": True, "peer_weight": 0.25})
    old, new = build_policy(config), build_policy(config)
    builder = ColumnBuilder()
    live: list[tuple[str, str, int]] = []
    for i in range(200):
        now = float(i)
        for _ in range(rng.randrange(0, 4)):
            rid = rng.choice(ids[:8]) if rng.random() < 0.5 else rng.choice(ids)  # some wide rows
            name = f"q{i}-{rng.randrange(10**9)}"
            prompt = rng.randrange(16, 4000)
            load.on_admitted(name, rid, now, prompt_tokens=prompt, uncached_tokens=prompt,
                             block_size=BS, max_tokens=rng.choice([None, 50, 900]))  # fmt: skip
            live.append((name, rid, 0))
        for k in rng.sample(range(len(live)), min(len(live), 5)):
            name, rid, generated = live[k]
            live[k] = (name, rid, generated + rng.randrange(1, 64))
            load.on_tokens(name, rid, now, live[k][2])
        if live and rng.random() < 0.4:
            name, rid, _ = live.pop(rng.randrange(len(live)))
            load.on_finished(name, now, rid)
        prompt = rng.choice([100, 2000, 8192])
        req = RoutingRequest(
            f"x{i}", prompt, BS, tuple(range(prompt // BS)), max_tokens=rng.choice([None, 30])
        )
        overlap = {rid: rng.choice([0, 3]) for rid in ids}
        snaps = build_snapshots(ids, overlap, load, now, static)
        columns = builder.build(ids, overlap, load, now, static)
        a, b = old.pick(req, snaps, now), new.pick(req, columns, now)
        assert (a.chosen, a.scores) == (b.chosen, b.scores)
    assert max(len(load.load(rid, 0.0).decoding) for rid in ids) > 4  # rows were widened


def test_an_older_build_still_scores_its_own_state() -> None:
    # Explain may re-score a kept (older) `ReplicaColumns` after newer picks: the table syncs
    # to whichever candidates it is given, so the old columns get their own scores back.
    ids = [f"r{i}" for i in range(20)]
    load = TokenLoad()
    for i, rid in enumerate(ids):
        load.on_admitted(f"a{i}", rid, 0.0, prompt_tokens=320, uncached_tokens=0,
                         block_size=BS, max_tokens=100 + 50 * i)  # fmt: skip
        load.on_prefill_done(f"a{i}", rid, 0.0)
    config = PolicyConfig(name="token_load", params={"remaining_decode": True})
    policy = build_policy(config)
    scorer = policy.scorers[0][0]
    builder = ColumnBuilder()
    req = RoutingRequest("x", 320, BS, tuple(range(20)), max_tokens=1000)
    rows = np.arange(len(ids))
    old = builder.build(ids, {}, load, 1.0)
    before = scorer.score_columns(req, old, rows, 1.0).values.copy()
    for i, rid in enumerate(ids[:10]):
        load.on_tokens(f"a{i}", rid, 2.0, 90)  # half the fleet nears its end
    new = builder.build(ids, {}, load, 2.0)
    after = scorer.score_columns(req, new, rows, 2.0).values
    assert not np.array_equal(before, after)
    assert np.array_equal(scorer.score_columns(req, old, rows, 1.0).values, before)
    fresh = build_policy(config).scorers[0][0]
    assert np.array_equal(fresh.score_columns(req, new, rows, 2.0).values, after)
    # and the table keeps one entry per candidate list, at most `KEEP`
    tables = DecodingTables()
    for n in range(DecodingTables.KEEP + 2):
        tables.of(ReplicaColumns.of([ReplicaSnapshot(f"s{n}")]))
    assert len(tables._tables) == DecodingTables.KEEP


def test_builder_versions_sync_only_the_changed_rows() -> None:
    # Columns from a `ColumnBuilder` carry `RowVersions`: the table re-reads only rows that got
    # a new load since the build it was synced to (also when an older build is re-scored), and
    # its sums equal a fresh table's full scan at every step.
    rng = random.Random(11)
    ids = [f"r{i}" for i in range(40)]
    load = TokenLoad()
    builder = ColumnBuilder()
    tables = DecodingTables()
    kept: list[ReplicaColumns] = []
    live: list[tuple[str, str, int]] = []
    for step in range(150):
        now = float(step)
        for _ in range(rng.randrange(0, 3)):
            rid = rng.choice(ids)
            name = f"q{step}-{rng.randrange(10**9)}"
            load.on_admitted(name, rid, now, prompt_tokens=64, uncached_tokens=64,
                             block_size=BS, max_tokens=rng.choice([None, 40, 700]))  # fmt: skip
            live.append((name, rid, 0))
        if live and rng.random() < 0.5:
            k = rng.randrange(len(live))
            name, rid, generated = live[k]
            live[k] = (name, rid, generated + rng.randrange(1, 30))
            load.on_tokens(name, rid, now, live[k][2])
        if live and rng.random() < 0.3:
            name, rid, _ = live.pop(rng.randrange(len(live)))
            load.on_finished(name, now, rid)
        columns = builder.build(ids, {}, load, now)
        assert columns.versions is not None
        kept.append(columns)
        # every few steps re-score an older build first (explain), then the newest
        for cols in ([rng.choice(kept)] if step % 7 == 3 else []) + [columns]:
            table = tables.of(cols)
            assert table.versions is cols.versions and table.version == cols.version
            fresh = DecodingTable(cols.ids)
            fresh.sync(cols.decodings())
            for out in (16, 300):
                for mine, theirs in zip(table.sums(None, out), fresh.sums(None, out), strict=True):
                    assert np.array_equal(mine, theirs)
    # a build with no load change re-reads nothing: a row changed behind the table's back (not
    # through the builder) is not seen, which proves the versions, not a scan, drove the sync
    columns = builder.build(ids, {}, load, 200.0)
    table = tables.of(columns)
    poisoned = list(table._decodings)
    poisoned[0] = ((5, 5),)
    table._decodings[0] = poisoned[0]
    again = builder.build(ids, {}, load, 201.0)
    assert tables.of(again)._decodings[0] is poisoned[0]
    # columns without a builder fall back to the full identity scan
    plain = ReplicaColumns.of(build_snapshots(ids, {}, load, 202.0))
    assert plain.versions is None
    assert tables.of(plain).versions is None
