"""Per-engine sequence bookkeeping for KV events: order, gaps, replay, restarts. Pure.

Every vLLM publisher numbers its messages ``0, 1, 2, ...`` (the ``seq`` frame) and keeps the
last ``buffer_steps`` (default 10,000) payloads for its replay socket. The subscriber feeds
every message it receives into :class:`SequenceTracker` and does what the returned
:class:`SeqStep` says; no sockets, no clock here (``now`` is passed in), so every rule below is
unit-testable.

Rules, per *source* (one engine publisher: a topic on a bound socket, or a connected endpoint),
with ``expected`` = the next seq this source should send:

* joining (:meth:`SequenceTracker.on_join`, the subscriber's start or a newly added engine
  with a replay socket and ``replay_on_join``): a replay from 0 at once, so a coordinator
  started over engines that already cache blocks rebuilds its index from their buffers without
  waiting for their next message (an idle engine may send none for a long time); live messages
  are held meanwhile; a join replay that brings nothing (the engine was not up) leaves the
  source as never heard, so its first message follows the next rule;
* first message from a source: with ``seq == 0`` (or ``replay_on_join=False``) it is applied
  and ``expected = seq + 1``; with ``seq > 0`` we joined late (or ZMQ's slow-joiner dropped the
  first messages), so a replay from 0 is requested to rebuild what the engine still buffers;
* ``seq == expected``: applied;
* ``seq > expected``: a gap (ZMQ dropped messages at a high-water mark): counted, the message
  is held, and a replay from ``expected`` is requested;
* ``seq < expected`` on the live stream: the engine restarted (a publisher never resends
  live): counted as a reset; the step says ``reset=True`` (drop the replica's entries, its
  cache is empty after a restart) and applies the message; if ``seq > 0`` it also asks for a
  replay from 0 of the new incarnation;
* during a replay, live messages are held (at most ``max_pending``; past that the replay is
  given up); replayed messages below ``expected`` are duplicates (skipped, counted);
  replayed messages above ``expected`` mean the engine's buffer no longer had the missing ones
  (counted in ``missed``, then applied); the end marker, a failure, or ``replay_timeout_s``
  (checked by :meth:`SequenceTracker.poll`) ends the replay and releases the held messages in
  order, skipping duplicates.

A gap that could not be filled leaves the index possibly stale for that replica (a missed
``BlockStored`` costs a false miss, a missed ``BlockRemoved`` a false hit until the entry is
re-stored, removed or capped); it is counted in ``missed`` rather than wiping the replica,
whose other entries are still right.

Public API (stable): :class:`SequenceTracker`, :class:`SeqStep`, :class:`SequenceCounters`.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import asdict, dataclass, field

DEFAULT_REPLAY_TIMEOUT_S = 2.0
DEFAULT_MAX_PENDING = 10_000


@dataclass(slots=True)
class SeqStep:
    """What the subscriber must do after one input, in this order.

    1. ``reset``: drop the replica's index entries;
    2. decode and apply each ``(seq, payload)`` of ``apply`` in order;
    3. ``replay_from`` not None: ask the source's replay socket for seq >= ``replay_from``
       (then feed the replies to ``on_replay`` and the end to ``on_replay_end``, or report
       ``on_replay_failed`` if there is no replay socket or it fails).
    """

    apply: list[tuple[int, bytes]] = field(default_factory=list)
    reset: bool = False
    replay_from: int | None = None


@dataclass(slots=True)
class SequenceCounters:
    messages: int = 0
    gaps: int = 0
    replays_requested: int = 0
    replays_completed: int = 0
    replays_failed: int = 0
    resets: int = 0
    duplicates: int = 0
    missed: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(slots=True)
class _Source:
    expected: int | None = None
    replaying: bool = False
    replay_started: float = 0.0
    # Joined late or after a restart: the seqs before the first one we get are not "missed".
    joining: bool = False
    pending: list[tuple[int, bytes]] = field(default_factory=list)


class SequenceTracker:
    """Sequence state of every source; see module doc for the rules."""

    def __init__(
        self,
        *,
        replay_timeout_s: float = DEFAULT_REPLAY_TIMEOUT_S,
        max_pending: int = DEFAULT_MAX_PENDING,
        replay_on_join: bool = True,
    ) -> None:
        self.replay_timeout_s = replay_timeout_s
        self.max_pending = max_pending
        self.replay_on_join = replay_on_join
        self.counters = SequenceCounters()
        self._sources: dict[Hashable, _Source] = {}

    def expected(self, source: Hashable) -> int | None:
        """The next seq expected from ``source`` (None before its first message)."""
        st = self._sources.get(source)
        return None if st is None else st.expected

    def replaying(self, source: Hashable) -> bool:
        st = self._sources.get(source)
        return st is not None and st.replaying

    def forget(self, source: Hashable) -> None:
        self._sources.pop(source, None)

    def _start_replay(self, st: _Source, start: int, now: float, step: SeqStep) -> None:
        st.joining = start == 0
        st.replaying = True
        st.replay_started = now
        st.expected = start
        step.replay_from = start
        self.counters.replays_requested += 1

    def on_join(self, source: Hashable, now: float) -> SeqStep:
        """Start following ``source``: a replay from 0 (module doc), unless ``replay_on_join``
        is off or the source was already heard from."""
        step = SeqStep()
        if not self.replay_on_join or source in self._sources:
            return step
        self._start_replay(self._sources.setdefault(source, _Source()), 0, now, step)
        return step

    def on_live(self, source: Hashable, seq: int, payload: bytes, now: float) -> SeqStep:
        """A message from the live (PUB/SUB) stream."""
        self.counters.messages += 1
        st = self._sources.get(source)
        if st is None:
            st = self._sources[source] = _Source()
        step = SeqStep()
        if st.replaying:
            last = st.pending[-1][0] if st.pending else (st.expected or 0) - 1
            if seq <= last:
                # Restarted while we were replaying its previous incarnation.
                st.replaying = False
                st.pending.clear()
                self.counters.replays_failed += 1
                return self._restart(st, seq, payload, now, step)
            st.pending.append((seq, payload))
            if len(st.pending) > self.max_pending:
                self.counters.replays_failed += 1
                return self._finish(st, step)
            return step
        if st.expected is None:
            if seq == 0 or not self.replay_on_join:
                st.expected = seq + 1
                step.apply.append((seq, payload))
            else:
                st.pending.append((seq, payload))
                self._start_replay(st, 0, now, step)
            return step
        if seq == st.expected:
            st.expected = seq + 1
            step.apply.append((seq, payload))
        elif seq > st.expected:
            self.counters.gaps += 1
            st.pending.append((seq, payload))
            self._start_replay(st, st.expected, now, step)
        else:
            return self._restart(st, seq, payload, now, step)
        return step

    def _restart(self, st: _Source, seq: int, payload: bytes, now: float, step: SeqStep) -> SeqStep:
        self.counters.resets += 1
        step.reset = True
        if seq == 0:
            st.expected = 1
            step.apply.append((seq, payload))
        else:
            st.pending.append((seq, payload))
            self._start_replay(st, 0, now, step)
        return step

    def on_replay(self, source: Hashable, seq: int, payload: bytes) -> SeqStep:
        """One message from the replay socket."""
        step = SeqStep()
        st = self._sources.get(source)
        if st is None or not st.replaying or st.expected is None:
            return step
        if seq < st.expected:
            self.counters.duplicates += 1
            return step
        if not st.joining:
            self.counters.missed += seq - st.expected
        st.joining = False
        st.expected = seq + 1
        step.apply.append((seq, payload))
        return step

    def on_replay_end(self, source: Hashable) -> SeqStep:
        """The replay socket sent its end marker."""
        st = self._sources.get(source)
        if st is None or not st.replaying:
            return SeqStep()
        self.counters.replays_completed += 1
        return self._finish(st, SeqStep())

    def on_replay_failed(self, source: Hashable) -> SeqStep:
        """No replay socket, or the replay broke off; release what was held."""
        st = self._sources.get(source)
        if st is None or not st.replaying:
            return SeqStep()
        self.counters.replays_failed += 1
        return self._finish(st, SeqStep())

    def poll(self, now: float) -> dict[Hashable, SeqStep]:
        """Give up replays older than ``replay_timeout_s``; their steps, per source."""
        out: dict[Hashable, SeqStep] = {}
        for source, st in self._sources.items():
            if st.replaying and now - st.replay_started >= self.replay_timeout_s:
                self.counters.replays_failed += 1
                out[source] = self._finish(st, SeqStep())
        return out

    def _finish(self, st: _Source, step: SeqStep) -> SeqStep:
        st.replaying = False
        if st.joining and st.expected == 0 and not st.pending:
            # a join replay that brought nothing: as if never heard (its first message decides)
            st.joining = False
            st.expected = None
            return step
        expected = st.expected or 0
        for seq, payload in st.pending:
            if seq < expected:
                self.counters.duplicates += 1
                continue
            if not st.joining:
                self.counters.missed += seq - expected
            st.joining = False
            expected = seq + 1
            step.apply.append((seq, payload))
        st.pending.clear()
        st.joining = False
        st.expected = expected
        return step
