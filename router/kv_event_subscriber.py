"""The KV event subscriber: ZMQ SUB sockets -> :class:`SequenceTracker` -> a KV index.

This is the router's one I/O edge. Two ways to meet engines (vLLM's publisher *binds* when its
``kv_events_config.endpoint`` contains ``*`` or ``::`` or is ``ipc://``/``inproc://``, and
*connects* otherwise):

* **bind mode** -- ``KvEventSubscriber(sink, bind_endpoint="tcp://0.0.0.0:5557")``: one SUB
  socket that many engines connect to (each engine configured with
  ``endpoint="tcp://<coordinator-host>:5557"`` and a *unique* ``topic``); messages are told apart
  by topic, so register each engine with ``EngineEventSource(replica_id, topic=...)`` and no
  ``endpoint``. Messages with an unregistered topic are counted (``unknown_topic``) and dropped.
* **connect mode** -- ``EngineEventSource(replica_id, endpoint="ipc:///tmp/e1.sock")`` (or
  ``tcp://engine-host:P`` for an engine bound to ``tcp://*:P``): one SUB socket per engine.

Per source (see :mod:`router.kv_event_sequencer` for the rules): in-order apply, gap -> replay
from the engine's replay socket (a DEALER sends ``[b"", start_seq as 8-byte BE]``; the ROUTER
answers ``[b"", topic, seq, payload]`` per buffered message and ends with seq ``0xff`` x 8 and
an empty payload; a replay ends as failed when no message comes for ``replay_timeout_s``,
however long it runs while messages come), restart (seq goes back) -> the replica's entries
are dropped and rebuilt from what follows, duplicates skipped, garbage (wrong frame count, bad
seq frame, payload that is not a KV event batch) counted and skipped -- a bad message never
stops the loop.
:meth:`KvEventSubscriber.remove_engine` closes the engine's socket and drops its entries.

Join replays (:attr:`KvEventSubscriber.replaying`): the engines whose replay from 0, asked at
:meth:`~KvEventSubscriber.start`, has not ended yet (completed, failed, or timed out after
``replay_timeout_s`` of silence). Until it is empty the index lacks what those engines cached
before we joined, so routing is cache-blind: the coordinator's ``/health`` says ``replaying``
(503) meanwhile. Engines added after ``start`` (a scale-up) are replayed too but do not count:
the rest of the index is whole then. ``join_deadline_s`` (default 10 s) after ``start``
``replaying`` is empty whatever is left: a replay that makes progress is not bounded by
``replay_timeout_s`` (an idle timeout), and a starved coordinator replaying four full
10,000-batch buffers could otherwise stay not ready for minutes (chaos `kill-coordinator` at
load 15: over 90 s); a cache-blind coordinator that serves is better than none.

Each replay that ends (completed, failed: silent for ``replay_timeout_s`` or a socket error,
or cancelled: replaced by a newer one) logs one INFO line -- replica, start seq, outcome,
messages replayed, events and blocks they stored, seconds from the request to the end --
and becomes a :class:`ReplayRecord`: the last per replica in
:attr:`KvEventSubscriber.last_replays`, and passed to ``on_replay_end`` when set (the
coordinator's ``pdorch_kv_replay_*`` metrics). A join replay's duration is what keeps a
restarted coordinator's ``/health`` at ``replaying``.

Counters (:meth:`KvEventSubscriber.metrics`): ``messages``, ``events``, ``blocks_stored``,
``blocks_removed``, ``gaps``, ``replays_requested``/``_completed``/``_failed``, ``resets``,
``duplicates``, ``missed``, ``garbage``, ``unknown_topic`` (and the sink's own counters when it
is a :class:`router.kv_index.KvIndex`).

Everything runs on the caller's asyncio loop; the sink is called from that loop only.

Public API (stable): :class:`KvEventSubscriber` (``start``, ``stop``, ``async with``,
``add_engine``, ``remove_engine``, ``reset_engine``, ``bound_endpoint``, ``metrics``,
``counters``, ``on_frames``, ``replaying``, ``last_replays``, ``on_replay_end``),
:class:`EngineEventSource`, :class:`ReplayRecord`, :class:`KvEventSink` (protocol:
``apply_batch``, ``clear_replica``, ``remove_replica`` -- what
:class:`~router.kv_index.KvIndex` offers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

import zmq
import zmq.asyncio

from router.kv_event_sequencer import DEFAULT_REPLAY_TIMEOUT_S, SeqStep, SequenceTracker
from router.kv_events import (
    END_OF_REPLAY_SEQ,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    KvEventDecodeError,
    KvEventDecoder,
)

log = logging.getLogger(__name__)


class KvEventSink(Protocol):
    """Where decoded batches go (a :class:`router.kv_index.KvIndex` is one)."""

    def apply_batch(self, replica_id: str, batch: KvEventBatch) -> None: ...

    def clear_replica(self, replica_id: str) -> int: ...

    def remove_replica(self, replica_id: str) -> int: ...


@dataclass(frozen=True, slots=True)
class EngineEventSource:
    """One engine's KV event publisher.

    ``endpoint``: the address to *connect* to when the engine binds (``ipc://...``,
    ``tcp://host:P``); None when the engine connects to the subscriber's bound socket.
    ``replay_endpoint``: the engine's replay (ROUTER) address, connectable; None: no replay
    (gaps are then only counted). ``topic``: the engine's ``kv_events_config.topic``; in bind
    mode it must be unique per engine, in connect mode it only filters.
    """

    replica_id: str
    endpoint: str | None = None
    replay_endpoint: str | None = None
    topic: str = ""


ReplayOutcome = Literal["completed", "failed", "cancelled"]


@dataclass(frozen=True, slots=True)
class ReplayRecord:
    """One ended replay (module doc): ``seconds`` from asking the engine's replay socket to
    the end marker, the give-up or the cancel; ``messages`` replayed batches received,
    ``events``/``blocks`` the events and stored blocks of the ones applied (duplicates of
    what the live stream already gave are skipped, so not counted); ``join``: a join replay
    of :meth:`KvEventSubscriber.start` (one that ``replaying`` waits for)."""

    replica_id: str
    start_seq: int
    outcome: ReplayOutcome
    messages: int
    events: int
    blocks: int
    seconds: float
    join: bool


@dataclass(slots=True)
class SubscriberCounters:
    garbage: int = 0
    unknown_topic: int = 0
    events: int = 0
    blocks_stored: int = 0
    blocks_removed: int = 0


class KvEventSubscriber:
    """Feeds KV events from many engines into one sink; see module doc."""

    def __init__(
        self,
        sink: KvEventSink,
        *,
        bind_endpoint: str | None = None,
        context: zmq.asyncio.Context | None = None,
        replay_timeout_s: float = DEFAULT_REPLAY_TIMEOUT_S,
        replay_on_join: bool = True,
        clock: Callable[[], float] = time.monotonic,
        rcvhwm: int = 100_000,
        join_deadline_s: float = 10.0,
    ) -> None:
        self.sink = sink
        self.bind_endpoint = bind_endpoint
        self.replay_timeout_s = replay_timeout_s
        self.counters = SubscriberCounters()
        self.tracker = SequenceTracker(
            replay_timeout_s=replay_timeout_s, replay_on_join=replay_on_join
        )
        self._clock = clock
        self._rcvhwm = rcvhwm
        self._ctx_arg = context
        self._ctx: zmq.asyncio.Context | None = None  # created by start()
        self._decoder = KvEventDecoder()
        self._sources: dict[str, EngineEventSource] = {}
        self._by_topic: dict[str, str] = {}
        self._bound: zmq.asyncio.Socket | None = None
        self._bound_endpoint: str | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._replays: dict[str, asyncio.Task[None]] = {}
        self._joining: set[str] = set()  # join replays of `start` not ended yet (`replaying`)
        self.join_deadline_s = join_deadline_s
        self._started_at = 0.0
        self._started = False
        self.last_replays: dict[str, ReplayRecord] = {}  # the last ended replay per replica
        self.on_replay_end: Callable[[ReplayRecord], None] | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Bind (bind mode) and start receiving from every registered engine."""
        if self._started:
            return
        self._started = True
        self._started_at = self._clock()
        self._ctx = self._ctx_arg if self._ctx_arg is not None else zmq.asyncio.Context()
        if self.bind_endpoint is not None:
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.RCVHWM, self._rcvhwm)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.bind(self.bind_endpoint)
            self._bound = sock
            self._bound_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            self._tasks[""] = asyncio.create_task(self._receive(sock, None))
        for source in self._sources.values():
            if source.endpoint is not None:
                self._open(source)
            self._join(source, initial=True)

    async def stop(self) -> None:
        """Stop all receive and replay tasks and close the sockets."""
        tasks = list(self._tasks.values()) + list(self._replays.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self._replays.clear()
        self._joining.clear()
        self._bound = None
        if self._ctx is not None and self._ctx_arg is None:
            self._ctx.destroy(linger=0)
        self._ctx = None
        self._started = False

    async def __aenter__(self) -> KvEventSubscriber:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def replaying(self) -> frozenset[str]:
        """The engines whose join replay (asked at `start`) has not ended, until
        `join_deadline_s` after `start`: see module doc."""
        if self._clock() - self._started_at >= self.join_deadline_s:
            return frozenset()
        return frozenset(self._joining)

    @property
    def bound_endpoint(self) -> str | None:
        """The address engines should connect to (port 0 resolved), in bind mode."""
        return self._bound_endpoint

    # -- engines -------------------------------------------------------------------------

    def add_engine(self, source: EngineEventSource) -> None:
        """Start following one engine (replaces an earlier registration of the same id)."""
        if source.replica_id in self._sources:
            self.remove_engine(source.replica_id, drop_entries=False)
        self._sources[source.replica_id] = source
        if source.endpoint is None:
            if source.topic in self._by_topic:
                raise ValueError(f"topic {source.topic!r} already belongs to another engine")
            self._by_topic[source.topic] = source.replica_id
        elif self._started:
            self._open(source)
        if self._started:
            self._join(source)

    def remove_engine(self, replica_id: str, *, drop_entries: bool = True) -> None:
        """Stop following ``replica_id``; by default also drop its index entries."""
        source = self._sources.pop(replica_id, None)
        if source is None:
            return
        if self._by_topic.get(source.topic) == replica_id:
            del self._by_topic[source.topic]
        for tasks in (self._tasks, self._replays):
            task = tasks.pop(replica_id, None)
            if task is not None:
                task.cancel()
        self._joining.discard(replica_id)
        self.tracker.forget(replica_id)
        if drop_entries:
            self.sink.remove_replica(replica_id)

    def reset_engine(self, replica_id: str) -> None:
        """The engine restarted (seen elsewhere, e.g. a new process start time): drop its
        entries and treat its next message as a first one (replay from 0 if its seq > 0).

        Needed because a restart is only visible in the stream when the new incarnation's
        first message we receive has a seq below the old one's; if reconnecting took long
        enough for the new seq to pass the old, it reads as a gap instead.
        """
        if replica_id not in self._sources:
            return
        task = self._replays.pop(replica_id, None)
        if task is not None:
            task.cancel()
        self._joining.discard(replica_id)  # its old cache is gone: nothing left to wait for
        self.tracker.forget(replica_id)
        self.sink.clear_replica(replica_id)

    def engines(self) -> list[EngineEventSource]:
        return list(self._sources.values())

    # -- receiving -----------------------------------------------------------------------

    def _open(self, source: EngineEventSource) -> None:
        assert source.endpoint is not None
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, self._rcvhwm)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, source.topic.encode("utf-8"))
        sock.connect(source.endpoint)
        self._tasks[source.replica_id] = asyncio.create_task(self._receive(sock, source.replica_id))

    def _join(self, source: EngineEventSource, *, initial: bool = False) -> None:
        """Replay ``source`` from 0 now (``SequenceTracker.on_join``) when it has a replay
        socket: a coordinator (re)started over a running fleet has its index rebuilt from the
        engines' buffers at once, not at each engine's next KV event. ``initial`` (from
        `start`): counted in `replaying` until that replay ends."""
        if source.replay_endpoint is None:
            return
        rid = source.replica_id
        self._do(rid, self.tracker.on_join(rid, self._clock()))
        if initial and rid in self._replays:
            self._joining.add(rid)

    async def _receive(self, sock: zmq.asyncio.Socket, replica_id: str | None) -> None:
        try:
            while True:
                frames = await sock.recv_multipart(copy=True)
                try:
                    self.on_frames(frames, replica_id)
                except Exception:  # never let one bad message stop ingestion
                    self.counters.garbage += 1
                    log.exception("KV event message failed; skipped")
        finally:
            sock.close(linger=0)

    def on_frames(self, frames: list[bytes], replica_id: str | None = None) -> None:
        """Process one live message (``replica_id`` None: tell the engine by its topic).

        Public so that benchmarks and tests can drive the subscriber without sockets.
        """
        if len(frames) != 3 or len(frames[1]) != 8:
            self.counters.garbage += 1
            return
        if replica_id is None:
            try:
                topic = frames[0].decode("utf-8")
            except UnicodeDecodeError:
                self.counters.garbage += 1
                return
            found = self._by_topic.get(topic)
            if found is None:
                self.counters.unknown_topic += 1
                return
            replica_id = found
        elif replica_id not in self._sources:
            return
        seq = int.from_bytes(frames[1], "big")
        step = self.tracker.on_live(replica_id, seq, frames[2], self._clock())
        self._do(replica_id, step)

    def _do(self, replica_id: Hashable, step: SeqStep) -> tuple[int, int]:
        """Carry out `step`; (events, blocks stored) it applied."""
        assert isinstance(replica_id, str)
        if step.reset:
            self.sink.clear_replica(replica_id)
        events = blocks = 0
        for _seq, payload in step.apply:
            try:
                batch = self._decoder.decode(payload)
            except KvEventDecodeError:
                self.counters.garbage += 1
                continue
            e, b = self._count(batch)
            events, blocks = events + e, blocks + b
            self.sink.apply_batch(replica_id, batch)
        if step.replay_from is not None:
            source = self._sources.get(replica_id)
            if source is None or source.replay_endpoint is None or self._ctx is None:
                e, b = self._do(replica_id, self.tracker.on_replay_failed(replica_id))
                events, blocks = events + e, blocks + b
            else:
                old = self._replays.pop(replica_id, None)
                if old is not None:
                    old.cancel()
                self._replays[replica_id] = asyncio.create_task(
                    self._replay(source, step.replay_from)
                )
        return events, blocks

    def _count(self, batch: KvEventBatch) -> tuple[int, int]:
        """Count `batch` in; (its events, the blocks it stored)."""
        c = self.counters
        c.events += len(batch.events)
        stored = 0
        for event in batch.events:
            if isinstance(event, BlockStored):
                stored += len(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                c.blocks_removed += len(event.block_hashes)
        c.blocks_stored += stored
        return len(batch.events), stored

    async def _replay(self, source: EngineEventSource, start_seq: int) -> None:
        rid = source.replica_id
        assert source.replay_endpoint is not None
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        ok = False
        started = self._clock()
        messages = events = blocks = 0
        outcome: ReplayOutcome = "cancelled"
        try:
            sock.connect(source.replay_endpoint)
            await sock.send_multipart([b"", start_seq.to_bytes(8, "big")])
            # an idle timeout, re-armed by every replayed message: a long replay that makes
            # progress (hundreds of batches applied on a busy coordinator loop, chaos
            # `kv-events-lost`: 367 batches took > 2 s at load 27 and were given up) goes on;
            # a silent replay socket still ends it after `replay_timeout_s`
            deadline = self._clock() + self.replay_timeout_s
            while True:
                left = deadline - self._clock()
                if left <= 0 or not await sock.poll(timeout=left * 1000):
                    break
                frames = await sock.recv_multipart()
                deadline = self._clock() + self.replay_timeout_s
                if len(frames) != 4 or len(frames[2]) != 8:
                    self.counters.garbage += 1
                    continue
                if frames[2] == END_OF_REPLAY_SEQ:
                    ok = True
                    break
                seq = int.from_bytes(frames[2], "big")
                messages += 1
                e, b = self._do(rid, self.tracker.on_replay(rid, seq, frames[3]))
                events, blocks = events + e, blocks + b
            outcome = "completed" if ok else "failed"
        except asyncio.CancelledError:
            raise
        except Exception:
            outcome = "failed"
            log.exception("replay from %s failed", source.replay_endpoint)
        finally:
            sock.close(linger=0)
            if self._replays.get(rid) is asyncio.current_task():
                del self._replays[rid]
            self._replay_ended(
                ReplayRecord(
                    rid,
                    start_seq,
                    outcome,
                    messages,
                    events,
                    blocks,
                    self._clock() - started,
                    rid in self._joining,
                )
            )
        # ended (or given up): the join, if this or the replay it replaced was one, is over;
        # a replay cancelled for a newer one (a gap seen meanwhile) leaves it to that one
        self._joining.discard(rid)
        if rid in self._sources:
            step = self.tracker.on_replay_end(rid) if ok else self.tracker.on_replay_failed(rid)
            self._do(rid, step)

    def _replay_ended(self, record: ReplayRecord) -> None:
        log.info(
            "KV replay of %s from seq %d %s: %d messages, %d events, %d blocks stored, %.3f s%s",
            record.replica_id,
            record.start_seq,
            record.outcome,
            record.messages,
            record.events,
            record.blocks,
            record.seconds,
            " (join)" if record.join else "",
        )
        self.last_replays[record.replica_id] = record
        if self.on_replay_end is not None:
            self.on_replay_end(record)

    # -- metrics -------------------------------------------------------------------------

    def metrics(self) -> dict[str, int]:
        """All counters, flat: the subscriber's, the tracker's, and the sink's if it has any."""
        out: dict[str, int] = dict(asdict(self.counters))
        out.update(self.tracker.counters.as_dict())
        sink_counters: Any = getattr(self.sink, "counters", None)
        if sink_counters is not None and hasattr(sink_counters, "as_dict"):
            for name, value in sink_counters.as_dict().items():
                out[f"index_{name}"] = value
        return out
