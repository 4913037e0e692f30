"""The hash-match monitor notices when predicted keys stop matching engine reports."""

from __future__ import annotations

import logging

import pytest

from router.hash_match_monitor import HashMatchMonitor
from router.kv_events import BlockStored
from router.kv_index import KvIndex


def index_with(replica: str, tokens: list[int]) -> KvIndex:
    idx = KvIndex("m", 4)
    n = len(tokens) // 4
    idx.apply(replica, [BlockStored(list(range(1, n + 1)), None, tokens[: n * 4], 4, medium="GPU")])
    return idx


def test_matching_predictions_keep_it_healthy(caplog: pytest.LogCaptureFixture) -> None:
    tokens = list(range(40))
    idx = index_with("a", tokens)
    mon = HashMatchMonitor(check_after_s=1.0, min_checks=3)
    for i in range(5):
        mon.on_routed("a", idx.keys_for(tokens), now=float(i))
    assert mon.evaluate(idx, now=2.5) == []  # only the ones routed at 0, 1 are due
    assert mon.counters.matched == 2
    mon.evaluate(idx, now=10.0)
    assert mon.counters.matched == 5 and mon.match_ratio == 1.0 and mon.healthy


def test_mismatch_is_counted_and_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    engine_tokens = list(range(40))
    router_tokens = [1, *engine_tokens[1:]]  # e.g. a BOS the engine does not add
    idx = index_with("a", engine_tokens)
    mon = HashMatchMonitor(check_after_s=0.0, min_checks=4, warn_below=0.5)
    with caplog.at_level(logging.WARNING, logger="router.hash_match_monitor"):
        for i in range(6):
            mon.on_routed("a", idx.keys_for(router_tokens), now=float(i))
            bad = mon.evaluate(idx, now=float(i))
            assert len(bad) == 1 and bad[0].replica_id == "a"
    assert mon.counters.mismatched == 6
    assert not mon.healthy and mon.match_ratio == 0.0
    assert len([r for r in caplog.records if "stopped matching" in r.message]) == 1
    # Back to matching: healthy again once the window's ratio recovers.
    for i in range(10):
        mon.on_routed("a", idx.keys_for(engine_tokens), now=10.0 + i)
    mon.evaluate(idx, now=30.0)
    assert mon.healthy


def test_short_prompts_are_ignored_and_pending_is_bounded() -> None:
    mon = HashMatchMonitor(max_pending=2)
    mon.on_routed("a", [], now=0.0)
    assert mon.counters.predictions == 0 and mon.match_ratio is None
    for k in range(3):
        mon.on_routed("a", [k], now=0.0)
    assert mon.counters.dropped == 1
