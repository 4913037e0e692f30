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
