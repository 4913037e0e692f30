"""The approximate index from routing history: TTL and LRU with a fake clock (`now` passed in)."""

from __future__ import annotations

import pytest

from router.approx_index import ApproxKvIndex


def test_records_match_like_the_precise_index() -> None:
    ax = ApproxKvIndex(ttl_s=10)
    ax.record("a", [1, 2, 3], now=0.0)
    ax.record("b", [1, 9], now=0.0)
    assert ax.match([1, 2, 3, 4], now=1.0) == {"a": 3, "b": 1}
    assert ax.match([5, 2, 3], now=1.0) == {}
    assert ax.match([], now=1.0) == {}


def test_entries_expire_after_the_ttl() -> None:
    ax = ApproxKvIndex(ttl_s=10)
    ax.record("a", [1, 2], now=0.0)
    ax.record("b", [1, 2], now=5.0)
    assert ax.match([1, 2], now=9.999) == {"a": 2, "b": 2}
    assert ax.match([1, 2], now=10.0) == {"b": 2}  # a's entries are gone at t + ttl
    assert ax.blocks("a") == 0
    assert ax.match([1, 2], now=15.0) == {}
    assert ax.evicted_ttl == 4


def test_rerecording_refreshes_ttl_and_lru_position() -> None:
    ax = ApproxKvIndex(ttl_s=10, max_blocks_per_replica=3)
    ax.record("a", [1, 2], now=0.0)
    ax.record("a", [1], now=8.0)  # refresh key 1
    assert ax.match([1, 2], now=12.0) == {"a": 1}  # key 2 expired, key 1 still fresh
    ax.record("a", [5, 6], now=12.0)
    ax.record("a", [7], now=12.5)  # 4 entries > 3: least recently recorded (1) goes
    assert ax.evicted_lru == 1
    assert ax.match([1], now=13.0) == {}
    assert ax.match([5, 6], now=13.0) == {"a": 2}
    assert ax.blocks("a") == 3


def test_clock_going_backwards_is_clamped() -> None:
    ax = ApproxKvIndex(ttl_s=10)
    ax.record("a", [1], now=100.0)
    ax.record("b", [1], now=50.0)  # treated as 100.0
    assert ax.match([1], now=109.0) == {"a": 1, "b": 1}
    assert ax.match([1], now=110.0) == {}


def test_remove_replica_frees_its_entries() -> None:
    ax = ApproxKvIndex()
    ax.record("a", [1, 2], now=0.0)
    ax.record("b", [1], now=0.0)
    ax.remove_replica("a")
    assert ax.replicas() == ["b"]
    ax.record("c", [3], now=1.0)  # reuses a's bit
    assert ax.match([1, 2], now=1.0) == {"b": 1}
    ax.remove_replica("missing")


def test_bad_parameters() -> None:
    with pytest.raises(ValueError):
        ApproxKvIndex(ttl_s=0)
    with pytest.raises(ValueError):
        ApproxKvIndex(max_blocks_per_replica=0)
