"""`ReplicaBitmap.match` against a plain per-replica reference: random fleets up to 300
replicas (masks with few and with many bits take different report paths), replicas removed
and their bits reused."""

from __future__ import annotations

import random

import pytest

from router.replica_bitmap import ReplicaBitmap


def _reference(held: dict[str, set[int]], keys: list[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for rid, blocks in held.items():
        depth = 0
        while depth < len(keys) and keys[depth] in blocks:
            depth += 1
        if depth:
            out[rid] = depth
    return out


@pytest.mark.parametrize("replicas", [1, 5, 40, 300])
def test_match_equals_reference(replicas: int) -> None:
    rng = random.Random(replicas)
    bitmap = ReplicaBitmap()
    held: dict[str, set[int]] = {}
    keys = list(range(1000, 1200))
    for i in range(replicas):
        rid = f"r{i}"
        depth = rng.choice([0, 3, 100, rng.randrange(0, 200), 200])
        held[rid] = set(keys[:depth]) | {rng.randrange(0, 999) for _ in range(5)}
        bit = bitmap.bit(rid)
        for key in held[rid]:
            bitmap.add(bit, key)
    for rid in rng.sample(sorted(held), replicas // 3):  # leave, then others take their bits
        bitmap.release(rid, held.pop(rid))
    for i in range(replicas // 4):
        rid = f"new{i}"
        held[rid] = set(keys[: rng.randrange(0, 200)])
        bit = bitmap.bit(rid)
        for key in held[rid]:
            bitmap.add(bit, key)
    assert bitmap.match(keys) == _reference(held, keys)
    assert bitmap.match(keys[:1]) == _reference(held, keys[:1])
    assert bitmap.match([]) == {}


def _fleet(
    rng: random.Random, bitmap: ReplicaBitmap, keys: list[int], n: int, tag: str
) -> dict[str, set[int]]:
    held: dict[str, set[int]] = {}
    for i in range(n):
        rid = f"{tag}{i}"
        # a gap (a middle block evicted) must end the match there, as in `_reference`
        depth = rng.choice([0, 1, 2, len(keys), rng.randrange(0, len(keys) + 1)])
        blocks = set(keys[:depth])
        if depth > 4 and rng.random() < 0.3:
            blocks.discard(keys[depth // 2])
        held[rid] = blocks
        bit = bitmap.bit(rid)
        for key in blocks:
            bitmap.add(bit, key)
    return held


@pytest.mark.parametrize("replicas", [1, 3, 30, 64, 257, 1024])
def test_depths_equal_reference_as_mapping_and_array(replicas: int) -> None:
    """`depths` is `match` (mapping) and the same numbers by bit index (array); whole fleets
    holding the whole prompt (the numpy unpack path) and single drop-outs (bit_length)."""
    rng = random.Random(1000 + replicas)
    bitmap = ReplicaBitmap()
    keys = list(range(5000, 5000 + 120))
    held = _fleet(rng, bitmap, keys, replicas, "r")
    for probe in (keys, keys[:1], keys[:7], [], [1, 2, 3], [*keys, 99]):
        want = _reference(held, probe)
        depths = bitmap.depths(probe)
        assert dict(depths) == want
        assert depths == want  # Mapping equality
        assert len(depths) == len(want)
        layout = depths.layout
        rows = layout.rows([*held, "nobody"])
        assert depths.array[rows].tolist() == [want.get(rid, 0) for rid in held] + [0]
        for rid in held:
            assert depths.get(rid, -1) == want.get(rid, -1)
            assert (rid in depths) == (rid in want)
        assert depths.get("nobody") is None and depths.get("nobody", 0) == 0
        assert "nobody" not in depths


def test_depths_layout_follows_joins_and_leaves() -> None:
    """A bit freed and reused by another replica gets a new layout (token): an answer taken
    before keeps naming the replicas of its own moment."""
    bitmap = ReplicaBitmap()
    keys = [11, 12, 13]
    for rid, depth in (("a", 3), ("b", 1)):
        bit = bitmap.bit(rid)
        for key in keys[:depth]:
            bitmap.add(bit, key)
    before = bitmap.depths(keys)
    assert bitmap.depths(keys).layout is before.layout  # unchanged fleet: shared layout
    bitmap.release("a", keys)
    bit = bitmap.bit("c")  # takes a's bit
    for key in keys[:2]:
        bitmap.add(bit, key)
    after = bitmap.depths(keys)
    assert after.layout.token != before.layout.token
    assert dict(before) == {"a": 3, "b": 1}
    assert dict(after) == {"c": 2, "b": 1}
    assert after.array[after.layout.rows(["a", "b", "c"])].tolist() == [0, 1, 2]
