"""The KV event subscriber over real ZMQ on loopback: both modes, gaps and replay, restarts,
garbage, duplicates, engines going away -- against a scripted publisher and vLLM's own.

``FakeEnginePublisher`` stands in for an engine (no engine can be told to drop a message): an
XPUB socket (PUB on the wire; XPUB only lets the test wait for the subscription instead of
losing the first messages to ZMQ's slow-joiner) plus a real ROUTER replay socket that answers
exactly as vLLM's does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import zmq
import zmq.asyncio

from router.kv_event_subscriber import EngineEventSource, KvEventSubscriber, ReplayRecord
from router.kv_events import (
    END_OF_REPLAY_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KvEventBatch,
    encode_event_batch,
)
from router.kv_index import KvIndex
from tests.waiting import async_wait_until

if TYPE_CHECKING:
    from vllm.distributed.kv_events import KVEventBatch

BS = 4


async def until(condition: Callable[[], object], deadline_s: float = 10.0, what: str = "") -> None:
    async def check() -> bool:
        return bool(condition())

    await async_wait_until(check, deadline_s, message=what or "condition")


def prompt(n: int, blocks: int = 2) -> list[int]:
    return list(range(n * 1000, n * 1000 + blocks * BS))


def store(n: int, first_hash: int, blocks: int = 2) -> BlockStored:
    hashes: list[int | bytes] = list(range(first_hash, first_hash + blocks))
    return BlockStored(hashes, None, prompt(n, blocks), BS, medium="GPU")


class FakeEnginePublisher:
    """An engine's KV event publisher, scriptable: it can skip sending a message live."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        *,
        bind: str | None = None,
        connect: str | None = None,
        replay_bind: str | None = None,
        topic: str = "kv-events",
    ) -> None:
        self.topic = topic.encode()
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        if bind:
            self.pub.bind(bind)
        if connect:
            self.pub.connect(connect)
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0
        self.replay: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        if replay_bind:
            self.replay = ctx.socket(zmq.ROUTER)
            self.replay.setsockopt(zmq.LINGER, 0)
            self.replay.bind(replay_bind)
            self._task = asyncio.create_task(self._serve_replay())
        self.replay_requests: list[int] = []
        self.replay_gap_s = 0.0  # pause before each replayed message (a slow replay)

    async def wait_subscribed(self, deadline_s: float = 10.0) -> None:
        msg = await asyncio.wait_for(self.pub.recv(), deadline_s)
        assert msg[:1] == b"\x01"

    async def publish(self, events: list[KvEvent], *, drop: bool = False) -> int:
        seq = self.seq
        self.seq += 1
        payload = encode_event_batch(KvEventBatch(time.time(), events, 0))
        self.buffer.append((seq, payload))
        if not drop:
            await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    async def send_raw(self, frames: list[bytes]) -> None:
        await self.pub.send_multipart(frames)

    def restart(self) -> None:
        """A new engine incarnation: seq from 0, empty replay buffer."""
        self.seq = 0
        self.buffer.clear()

    async def _serve_replay(self) -> None:
        assert self.replay is not None
        while True:
            client, _empty, start = await self.replay.recv_multipart()
            start_seq = int.from_bytes(start, "big")
            self.replay_requests.append(start_seq)
            for seq, payload in list(self.buffer):
                if seq >= start_seq:
                    if self.replay_gap_s:  # the behaviour under test: a slow replayer
                        await asyncio.sleep(self.replay_gap_s)
                    await self.replay.send_multipart(
                        [client, b"", self.topic, seq.to_bytes(8, "big"), payload]
                    )
            await self.replay.send_multipart([client, b"", b"", END_OF_REPLAY_SEQ, b""])

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.pub.close(0)
        if self.replay is not None:
            self.replay.close(0)


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def ipc(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="pdorch-sub-"))

    def make(name: str) -> str:
        return f"ipc://{base}/{name}"

    return make


Connected = tuple[FakeEnginePublisher, KvEventSubscriber, KvIndex]


@pytest.fixture
async def connected(
    ctx: zmq.asyncio.Context, ipc: Callable[[str], str]
) -> AsyncIterator[Connected]:
    """One engine that binds (connect mode), with a replay socket, and a running subscriber."""
    pub = FakeEnginePublisher(ctx, bind=ipc("ev"), replay_bind=ipc("replay"))
    idx = KvIndex("m", BS)
    sub = KvEventSubscriber(idx, context=ctx, replay_timeout_s=5.0)
    sub.add_engine(EngineEventSource("e1", endpoint=ipc("ev"), replay_endpoint=ipc("replay")))
    await sub.start()
    await pub.wait_subscribed()
    # the subscriber's start replays every engine from 0 (its buffer: empty here)
    await until(lambda: sub.metrics()["replays_completed"] == 1, what="join replay done")
    yield pub, sub, idx
    await sub.stop()
    await pub.close()


def cached(idx: KvIndex, replica: str, n: int, blocks: int = 2) -> int:
    return idx.match(idx.keys_for(prompt(n, blocks))).get(replica, 0)


async def test_in_order_events_reach_the_index(connected: Connected) -> None:
    pub, sub, idx = connected
    await pub.publish([store(1, 10)])
    await pub.publish([store(2, 20), BlockRemoved([11], "GPU")])
    await until(lambda: cached(idx, "e1", 2) == 2, what="second prompt indexed")
    assert cached(idx, "e1", 1) == 1  # block 11 (second block of prompt 1) was removed
    m = sub.metrics()
    assert m["messages"] == 2 and m["events"] == 3
    assert m["blocks_stored"] == 4 and m["blocks_removed"] == 1
    assert m["gaps"] == 0 and m["garbage"] == 0
    assert m["index_blocks_stored"] == 4


async def test_gap_is_filled_from_the_replay_socket(connected: Connected) -> None:
    pub, sub, idx = connected
    await pub.publish([store(1, 10)])
    await pub.publish([store(2, 20)], drop=True)  # lost on the wire (e.g. high-water mark)
    await pub.publish([store(3, 30)], drop=True)
    await pub.publish([store(4, 40)])
    await until(lambda: sub.metrics()["replays_completed"] == 2, what="replay done")
    for n in (1, 2, 3, 4):
        assert cached(idx, "e1", n) == 2
    assert pub.replay_requests == [0, 1]  # the join at start, then the gap
    m = sub.metrics()
    assert m["gaps"] == 1 and m["missed"] == 0 and m["duplicates"] == 1
    # Later messages flow normally again.
    await pub.publish([store(5, 50)])
    await until(lambda: cached(idx, "e1", 5) == 2)
    assert idx.counters.duplicate_blocks == 0


async def test_a_replay_longer_than_the_timeout_that_makes_progress_completes(
    ctx: zmq.asyncio.Context, ipc: Callable[[str], str]
) -> None:
    """replay_timeout_s bounds the silence between replayed messages, not the whole replay:
    12 lost batches replayed 0.1 s apart (1.2 s in all) against a 0.5 s timeout."""
    pub = FakeEnginePublisher(ctx, bind=ipc("ev"), replay_bind=ipc("replay"))
    idx = KvIndex("m", BS)
    sub = KvEventSubscriber(idx, context=ctx, replay_timeout_s=0.5)
    sub.add_engine(EngineEventSource("e1", endpoint=ipc("ev"), replay_endpoint=ipc("replay")))
    await sub.start()
    try:
        await pub.wait_subscribed()
        await until(lambda: sub.metrics()["replays_completed"] == 1, what="join replay done")
        await pub.publish([store(1, 10)])
        await until(lambda: cached(idx, "e1", 1) == 2, what="first batch indexed")
        pub.replay_gap_s = 0.1
        for n in range(2, 14):
            await pub.publish([store(n, n * 10)], drop=True)
        await pub.publish([store(14, 140)])
        await until(
            lambda: sub.metrics()["replays_completed"] + sub.metrics()["replays_failed"] == 2,
            what="replay ended",
        )
        m = sub.metrics()
        assert m["replays_completed"] == 2 and m["missed"] == 0, m
        assert all(cached(idx, "e1", n) == 2 for n in range(1, 15))
    finally:
        await sub.stop()
        await pub.close()


async def test_restart_drops_the_replica_and_rebuilds(connected: Connected) -> None:
    pub, sub, idx = connected
    await pub.publish([store(1, 10)])
    await pub.publish([store(2, 20)])
    await until(lambda: cached(idx, "e1", 2) == 2)
    pub.restart()
    await pub.publish([store(3, 10)])  # new incarnation reuses hash numbers for other blocks
    await until(lambda: cached(idx, "e1", 3) == 2, what="rebuilt after restart")
    assert cached(idx, "e1", 1) == 0 and cached(idx, "e1", 2) == 0
    assert idx.blocks("e1") == 2
    assert sub.metrics()["resets"] == 1


async def test_garbage_is_counted_and_skipped(connected: Connected) -> None:
    pub, sub, idx = connected
    await pub.publish([store(1, 10)])
    await pub.send_raw([pub.topic, b"\x00\x01"])  # two frames
    await pub.send_raw([pub.topic, b"\x00" * 3, b"x"])  # short seq
    await pub.send_raw([pub.topic, (1).to_bytes(8, "big"), b"\xc1 not msgpack"])
    pub.seq = 2  # the garbage payload used seq 1
    await pub.publish([store(2, 20)])
    await until(lambda: cached(idx, "e1", 2) == 2, what="good message after garbage")
    m = sub.metrics()
    assert m["garbage"] == 3 and m["gaps"] == 0 and m["resets"] == 0


async def test_duplicate_stores_are_idempotent(connected: Connected) -> None:
    pub, _sub, idx = connected
    await pub.publish([store(1, 10)])
    await pub.publish([store(1, 10), AllBlocksCleared(), store(1, 10), store(1, 10)])
    await until(lambda: idx.counters.events == 5)
    assert idx.blocks("e1") == 2 and idx.counters.duplicate_blocks == 4


async def test_removed_engine_loses_its_entries_and_is_ignored(connected: Connected) -> None:
    pub, sub, idx = connected
    await pub.publish([store(1, 10)])
    await until(lambda: cached(idx, "e1", 1) == 2)
    sub.remove_engine("e1")
    assert idx.replicas() == [] and cached(idx, "e1", 1) == 0
    assert sub.engines() == []


async def test_bind_mode_tells_engines_apart_by_topic(ctx: zmq.asyncio.Context) -> None:
    idx = KvIndex("m", BS)
    sub = KvEventSubscriber(idx, bind_endpoint="tcp://127.0.0.1:0", context=ctx)
    sub.add_engine(EngineEventSource("a", topic="engine-a"))
    sub.add_engine(EngineEventSource("b", topic="engine-b"))
    with pytest.raises(ValueError):
        sub.add_engine(EngineEventSource("c", topic="engine-a"))
    await sub.start()
    endpoint = sub.bound_endpoint
    assert endpoint is not None and endpoint.startswith("tcp://127.0.0.1:")
    pubs = [
        FakeEnginePublisher(ctx, connect=endpoint, topic=t)
        for t in ("engine-a", "engine-b", "stranger")
    ]
    try:
        for p in pubs:
            await p.wait_subscribed()
        await pubs[0].publish([store(1, 10)])
        await pubs[1].publish([store(2, 10)])  # same engine hash, other engine: no clash
        await pubs[2].publish([store(3, 30)])
        await until(lambda: cached(idx, "a", 1) == 2 and cached(idx, "b", 2) == 2)
        await until(lambda: sub.metrics()["unknown_topic"] == 1)
        assert cached(idx, "a", 2) == 0 and cached(idx, "b", 1) == 0
        assert sorted(idx.replicas()) == ["a", "b"]
        # Engine b restarts (reconnects, seq back to 0).
        await pubs[1].publish([store(4, 40)])
        pubs[1].restart()
        await pubs[1].publish([store(5, 50)])
        await until(lambda: cached(idx, "b", 5) == 2)
        assert cached(idx, "b", 2) == 0 and cached(idx, "a", 1) == 2
    finally:
        await sub.stop()
        for p in pubs:
            await p.close()


async def test_late_join_rebuilds_from_the_replay_buffer(
    ctx: zmq.asyncio.Context, ipc: Callable[[str], str]
) -> None:
    pub = FakeEnginePublisher(ctx, bind=ipc("ev"), replay_bind=ipc("replay"))
    for n in range(3):
        await pub.publish([store(n, 10 * (n + 1))])  # nobody listens yet
    idx = KvIndex("m", BS)
    sub = KvEventSubscriber(idx, context=ctx)
    sub.add_engine(EngineEventSource("e1", endpoint=ipc("ev"), replay_endpoint=ipc("replay")))
    await sub.start()
    try:
        await pub.wait_subscribed()
        await pub.publish([store(3, 40)])
        await until(lambda: all(cached(idx, "e1", n) == 2 for n in range(4)))
        assert pub.replay_requests == [0]
        assert sub.metrics()["missed"] == 0
    finally:
        await sub.stop()
        await pub.close()


async def test_start_over_an_idle_engine_rebuilds_the_index_without_a_new_event(
    ctx: zmq.asyncio.Context, ipc: Callable[[str], str]
) -> None:
    """A coordinator restarted over a running fleet: the engine caches blocks and publishes
    nothing more (idle); the index is rebuilt from its replay buffer at start anyway."""
    pub = FakeEnginePublisher(ctx, bind=ipc("ev"), replay_bind=ipc("replay"))
    for n in range(3):
        await pub.publish([store(n, 10 * (n + 1))])  # before the subscriber (re)starts
    idx = KvIndex("m", BS)
    sub = KvEventSubscriber(idx, context=ctx)
    sub.add_engine(EngineEventSource("e1", endpoint=ipc("ev"), replay_endpoint=ipc("replay")))
    await sub.start()
    try:
        await until(lambda: all(cached(idx, "e1", n) == 2 for n in range(3)), what="rebuilt")
        assert pub.replay_requests == [0]
        assert sub.metrics()["messages"] == 0 and sub.metrics()["missed"] == 0
        await pub.wait_subscribed()
        await pub.publish([store(3, 40)])  # live again after the join replay: applied in order
        await until(lambda: cached(idx, "e1", 3) == 2)
        assert sub.metrics()["gaps"] == 0 and pub.replay_requests == [0]
    finally:
        await sub.stop()
        await pub.close()


async def test_replaying_names_the_join_replays_of_start_until_they_end_or_the_deadline(
    ctx: zmq.asyncio.Context, ipc: Callable[[str], str]
) -> None:
    """`replaying` (what `/health` reads): the engines whose join replay, asked at `start`, has
    not ended; an engine added later does not count; `join_deadline_s` after `start` nothing
    does, even while a replay still runs (a silent replay socket here: a bound ROUTER that
    never answers)."""
    silent = ctx.socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind(ipc("silent"))
    pub = FakeEnginePublisher(ctx, bind=ipc("ev"), replay_bind=ipc("replay"))
    await pub.publish([store(0, 10)])
    now = [0.0]
    sub = KvEventSubscriber(KvIndex("m", BS), context=ctx, clock=lambda: now[0])
    sub.add_engine(EngineEventSource("held", replay_endpoint=ipc("silent"), topic="h"))
    sub.add_engine(EngineEventSource("e1", endpoint=ipc("ev"), replay_endpoint=ipc("replay")))
    await sub.start()
    try:
        assert "held" in sub.replaying
        await until(lambda: sub.replaying == {"held"}, what="e1's join replay ended")
        sub.add_engine(EngineEventSource("late", replay_endpoint=ipc("silent"), topic="l"))
        assert sub.replaying == {"held"}  # joined after start: not a restart's rebuild
        now[0] = sub.join_deadline_s
        assert sub.replaying == frozenset()
    finally:
        await sub.stop()
        await pub.close()
        silent.close(linger=0)


async def test_gap_without_replay_socket_is_counted(
    ctx: zmq.asyncio.Context, ipc: Callable[[str], str]
) -> None:
    pub = FakeEnginePublisher(ctx, bind=ipc("ev"))
    idx = KvIndex("m", BS)
    sub = KvEventSubscriber(idx, context=ctx)
    sub.add_engine(EngineEventSource("e1", endpoint=ipc("ev")))
    await sub.start()
    try:
        await pub.wait_subscribed()
        await pub.publish([store(1, 10)])
        await pub.publish([store(2, 20)], drop=True)
        await pub.publish([store(3, 30)])
        await until(lambda: cached(idx, "e1", 3) == 2)
        m = sub.metrics()
        assert m["gaps"] == 1 and m["replays_failed"] == 1 and m["missed"] == 1
        assert cached(idx, "e1", 2) == 0
    finally:
        await sub.stop()
        await pub.close()


def vllm_stored_batch(n: int) -> KVEventBatch:
    """vLLM's own event batch storing prompt `n`'s two blocks (engine hashes n*10+1, n*10+2)."""
    from vllm.distributed.kv_events import BlockStored, KVEventBatch

    stored = BlockStored(
        block_hashes=[n * 10 + 1, n * 10 + 2],
        parent_block_hash=None,
        token_ids=prompt(n),
        block_size=BS,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )
    return KVEventBatch(ts=time.time(), events=[stored])


async def test_vllm_publisher_late_join_and_replay(ipc: Callable[[str], str]) -> None:
    """vLLM's own ZmqEventPublisher (binds on ipc) and its ROUTER replay socket."""
    from vllm.distributed.kv_events import ZmqEventPublisher

    publisher = ZmqEventPublisher(
        data_parallel_rank=0, endpoint=ipc("vev"), replay_endpoint=ipc("vrep"), topic="kv"
    )
    idx = KvIndex("m", BS)
    sub = KvEventSubscriber(idx)
    try:
        for n in range(3):  # published before anyone subscribes: only replay can bring them
            publisher.publish(vllm_stored_batch(n))
        # Sent (into the void) and buffered for replay before the subscriber exists.
        await until(lambda: len(publisher._buffer) == 3, what="vLLM publisher sent 3 batches")
        sub.add_engine(
            EngineEventSource("v", endpoint=ipc("vev"), replay_endpoint=ipc("vrep"), topic="kv")
        )
        await sub.start()
        n = 3

        # Publish until the subscription has propagated; then replay brings the rest.
        def publish_more() -> bool:
            nonlocal n
            if all(cached(idx, "v", i) == 2 for i in range(n)):
                return True
            if sub.metrics()["messages"]:
                return False  # live stream reached us; the replay is bringing the rest
            publisher.publish(vllm_stored_batch(n))
            n += 1
            return False

        await until(publish_more, deadline_s=20.0, what="all vLLM batches indexed")
        # The replayed batches are applied before the replay's end marker is read, so the
        # completion is counted a moment after the last block is indexed (seen in CI): await it.
        await until(
            lambda: sub.metrics()["replays_completed"] >= 1, what="the replay counted complete"
        )
        m = sub.metrics()
        assert m["replays_requested"] >= 1
        assert m["garbage"] == 0
    finally:
        await sub.stop()
        publisher.shutdown()


async def test_vllm_publisher_connects_to_a_bound_subscriber(ipc: Callable[[str], str]) -> None:
    """Bind mode with vLLM's own publisher: endpoint ``tcp://127.0.0.1:P`` makes it connect."""
    from vllm.distributed.kv_events import ZmqEventPublisher

    idx = KvIndex("m", BS)
    sub = KvEventSubscriber(idx, bind_endpoint="tcp://127.0.0.1:0")
    await sub.start()
    assert sub.bound_endpoint is not None
    sub.add_engine(EngineEventSource("v", replay_endpoint=ipc("vrep2"), topic="engine-v"))
    publisher = ZmqEventPublisher(
        data_parallel_rank=0,
        endpoint=sub.bound_endpoint,
        replay_endpoint=ipc("vrep2"),
        topic="engine-v",
    )
    sent = 0

    def publish_until_indexed() -> bool:
        nonlocal sent
        if sent and all(cached(idx, "v", i) == 2 for i in range(sent)):
            return True
        if sent and sub.metrics()["messages"]:
            return False  # connected; replay or the live stream brings the rest
        publisher.publish(vllm_stored_batch(sent))
        sent += 1
        return False

    try:
        await until(publish_until_indexed, deadline_s=20.0, what="vLLM batches indexed")
        assert sub.metrics()["garbage"] == 0 and sub.metrics()["unknown_topic"] == 0
    finally:
        await sub.stop()
        publisher.shutdown()


async def test_reset_engine_drops_entries_and_rejoins(connected: Connected) -> None:
    """A restart noticed elsewhere: the next message (seq > old expected) rebuilds by replay."""
    pub, sub, idx = connected
    await pub.publish([store(1, 10)])
    await until(lambda: cached(idx, "e1", 1) == 2)
    pub.restart()
    sub.reset_engine("e1")
    assert idx.blocks("e1") == 0
    for n in range(2, 5):
        await pub.publish([store(n, 10 * n)], drop=n < 4)  # new incarnation: 0, 1 lost
    await until(lambda: all(cached(idx, "e1", n) == 2 for n in range(2, 5)))
    assert cached(idx, "e1", 1) == 0
    assert pub.replay_requests == [0, 0]  # the join at start, then the rejoin


async def test_each_ended_replay_logs_one_info_line_and_keeps_its_record(
    ctx: zmq.asyncio.Context, ipc: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    """A join replay of 3 buffered batches (2 blocks each) and one from a replay socket that
    never answers: one INFO line each (messages, events, blocks, seconds, outcome), the
    last record per replica kept and handed to `on_replay_end`."""
    silent = ctx.socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind(ipc("silent"))
    pub = FakeEnginePublisher(ctx, bind=ipc("ev"), replay_bind=ipc("replay"))
    for n in range(3):
        await pub.publish([store(n, 10 * (n + 1))])  # buffered before the subscriber starts
    sub = KvEventSubscriber(KvIndex("m", BS), context=ctx, replay_timeout_s=0.3)
    ended: list[ReplayRecord] = []
    sub.on_replay_end = ended.append
    sub.add_engine(EngineEventSource("e1", endpoint=ipc("ev"), replay_endpoint=ipc("replay")))
    sub.add_engine(EngineEventSource("held", replay_endpoint=ipc("silent"), topic="h"))
    caplog.set_level(logging.INFO, logger="router.kv_event_subscriber")
    started = time.monotonic()
    await sub.start()
    try:
        await until(lambda: len(ended) == 2, what="both replays ended")
        elapsed = time.monotonic() - started
        done, failed = sub.last_replays["e1"], sub.last_replays["held"]
        assert sorted(ended, key=lambda r: r.replica_id) == [done, failed]
        assert (done.outcome, done.start_seq, done.join) == ("completed", 0, True)
        assert (done.messages, done.events, done.blocks) == (3, 3, 6)
        assert 0 <= done.seconds <= elapsed
        assert (failed.outcome, failed.messages, failed.blocks, failed.join) == (
            "failed",
            0,
            0,
            True,
        )
        assert 0.3 <= failed.seconds <= elapsed  # the idle timeout, then given up
        lines = [r for r in caplog.records if r.getMessage().startswith("KV replay of ")]
        assert [r.levelno for r in lines] == [logging.INFO, logging.INFO]
        text = sorted(r.getMessage() for r in lines)
        assert text[0].startswith(
            "KV replay of e1 from seq 0 completed: 3 messages, 3 events, 6 blocks stored, "
        )
        assert text[0].endswith(" s (join)")
        assert text[1].startswith("KV replay of held from seq 0 failed: 0 messages, ")
    finally:
        await sub.stop()
        await pub.close()
        silent.close(linger=0)
