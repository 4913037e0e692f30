"""Sequence rules per engine: order, gaps and replay, restarts, duplicates, timeouts. Pure."""

from __future__ import annotations

from router.kv_event_sequencer import SequenceTracker


def seqs(step_apply: list[tuple[int, bytes]]) -> list[int]:
    return [s for s, _ in step_apply]


def test_in_order_messages_are_applied() -> None:
    t = SequenceTracker()
    for i in range(3):
        step = t.on_live("e", i, b"%d" % i, now=0.0)
        assert seqs(step.apply) == [i] and not step.reset and step.replay_from is None
    assert t.expected("e") == 3


def test_gap_requests_replay_and_releases_held_messages_in_order() -> None:
    t = SequenceTracker()
    t.on_live("e", 0, b"0", 0.0)
    step = t.on_live("e", 3, b"3", 0.0)
    assert step.apply == [] and step.replay_from == 1
    assert t.counters.gaps == 1 and t.replaying("e")
    assert t.on_live("e", 4, b"4", 0.1).apply == []  # held during the replay
    assert seqs(t.on_replay("e", 1, b"1").apply) == [1]
    assert seqs(t.on_replay("e", 2, b"2").apply) == [2]
    assert seqs(t.on_replay("e", 3, b"3").apply) == [3]  # replay also has 3: applied once
    end = t.on_replay_end("e")
    assert seqs(end.apply) == [4]
    assert t.counters.duplicates == 1 and t.counters.missed == 0
    assert t.counters.replays_completed == 1 and t.expected("e") == 5


def test_replay_that_lacks_old_messages_counts_them_missed() -> None:
    t = SequenceTracker()
    t.on_live("e", 0, b"", 0.0)
    t.on_live("e", 10, b"", 0.0)
    assert seqs(t.on_replay("e", 7, b"").apply) == [7]  # 1..6 fell out of the engine buffer
    assert seqs(t.on_replay_end("e").apply) == [10]
    assert t.counters.missed == 6 + 2


def test_failed_replay_releases_held_messages() -> None:
    t = SequenceTracker()
    t.on_live("e", 0, b"", 0.0)
    t.on_live("e", 5, b"", 0.0)
    step = t.on_replay_failed("e")
    assert seqs(step.apply) == [5]
    assert t.counters.replays_failed == 1 and t.counters.missed == 4
    assert seqs(t.on_live("e", 6, b"", 0.0).apply) == [6]


def test_replay_times_out() -> None:
    t = SequenceTracker(replay_timeout_s=2.0)
    t.on_live("e", 0, b"", 0.0)
    t.on_live("e", 2, b"", 10.0)
    assert t.poll(11.9) == {}
    steps = t.poll(12.0)
    assert seqs(steps["e"].apply) == [2]
    assert not t.replaying("e")
    # A late replay reply after giving up is ignored.
    assert t.on_replay("e", 1, b"").apply == []


def test_restart_resets_the_replica() -> None:
    t = SequenceTracker()
    for i in range(5):
        t.on_live("e", i, b"", 0.0)
    step = t.on_live("e", 0, b"new", 1.0)
    assert step.reset and seqs(step.apply) == [0] and step.replay_from is None
    assert t.counters.resets == 1 and t.expected("e") == 1


def test_restart_seen_late_resets_and_replays_the_new_incarnation() -> None:
    t = SequenceTracker()
    for i in range(10):
        t.on_live("e", i, b"", 0.0)
    step = t.on_live("e", 3, b"", 1.0)
    assert step.reset and step.apply == [] and step.replay_from == 0
    assert seqs(t.on_replay("e", 0, b"").apply) == [0]
    t.on_replay("e", 1, b"")
    t.on_replay("e", 2, b"")
    assert seqs(t.on_replay_end("e").apply) == [3]
    assert t.counters.missed == 0


def test_late_join_replays_from_zero_without_counting_missed() -> None:
    t = SequenceTracker()
    step = t.on_live("e", 500, b"", 0.0)
    assert step.replay_from == 0 and step.apply == []
    assert seqs(t.on_replay("e", 400, b"").apply) == [400]  # 0..399 are gone: not "missed"
    assert seqs(t.on_replay_end("e").apply) == [500]
    assert t.counters.missed == 99
    joined = SequenceTracker(replay_on_join=False)
    assert seqs(joined.on_live("e", 500, b"", 0.0).apply) == [500]


def test_join_replays_from_zero_before_any_message() -> None:
    """A coordinator (re)started over an engine that already caches blocks: the replay starts
    at the join, live messages are held behind it, nothing counts as missed."""
    t = SequenceTracker()
    assert t.on_join("e", 0.0).replay_from == 0
    assert t.on_join("e", 0.1).replay_from is None  # once per source
    assert t.on_live("e", 31, b"", 0.2).apply == []  # held while the replay runs
    assert seqs(t.on_replay("e", 10, b"").apply) == [10]  # 0..9 gone from the buffer
    assert seqs(t.on_replay("e", 30, b"").apply) == [30]  # (11..29 were not in it either)
    assert seqs(t.on_replay_end("e").apply) == [31]
    assert t.expected("e") == 32 and t.counters.replays_completed == 1
    assert t.counters.missed == 19  # 11..29: a hole inside what the buffer had
    assert SequenceTracker(replay_on_join=False).on_join("e", 0.0).replay_from is None


def test_join_replay_that_brings_nothing_leaves_the_source_unheard() -> None:
    """The engine was not up (replay failed) or its buffer was empty: the first message then
    follows the first-message rule (seq > 0: replay from 0, no gap, nothing missed)."""
    t = SequenceTracker()
    t.on_join("e", 0.0)
    assert t.on_replay_failed("e").apply == [] and t.expected("e") is None
    assert t.on_live("e", 7, b"", 1.0).replay_from == 0
    assert t.counters.gaps == 0 and t.counters.missed == 0


def test_late_join_without_replay_socket_applies_what_it_has() -> None:
    t = SequenceTracker()
    t.on_live("e", 500, b"", 0.0)
    assert seqs(t.on_replay_failed("e").apply) == [500]
    assert t.counters.missed == 0


def test_restart_during_replay_abandons_it() -> None:
    t = SequenceTracker()
    t.on_live("e", 0, b"", 0.0)
    t.on_live("e", 5, b"", 0.0)
    step = t.on_live("e", 0, b"", 0.5)
    assert step.reset and seqs(step.apply) == [0]
    assert not t.replaying("e")


def test_too_many_held_messages_give_up_the_replay() -> None:
    t = SequenceTracker(max_pending=3)
    t.on_live("e", 0, b"", 0.0)
    t.on_live("e", 2, b"", 0.0)
    t.on_live("e", 3, b"", 0.0)
    t.on_live("e", 4, b"", 0.0)
    step = t.on_live("e", 5, b"", 0.0)
    assert seqs(step.apply) == [2, 3, 4, 5]
    assert t.counters.replays_failed == 1


def test_sources_are_independent_and_forgettable() -> None:
    t = SequenceTracker()
    t.on_live("a", 0, b"", 0.0)
    assert seqs(t.on_live("b", 0, b"", 0.0).apply) == [0]
    t.forget("a")
    assert t.expected("a") is None
    assert t.on_replay_end("a").apply == []
