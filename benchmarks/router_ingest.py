"""Measure KV-event ingestion throughput (blocks/s) for ``pdorch bench router``.

What is timed: for every message, :meth:`KvEventSubscriber.on_frames` -- frame checks,
sequence tracking, msgpack decoding, and :meth:`KvIndex.apply` (own-key recomputation from the
token ids, engine-hash map, bitmask update). Not timed: building and encoding the synthetic
messages, and socket I/O (ZMQ moves ~1M small messages/s, far above this path).

Workload (deterministic for a given ``seed``): ``replicas`` engines each publish
``BlockStored`` events of ``blocks_per_event`` full blocks (``block_size`` random token ids in
``[0, 32000)`` each); a quarter of the events continue a previous chain of the same replica
(``parent_block_hash`` set), and after every 4 stores the replica evicts the blocks of one
earlier event (``BlockRemoved``), so the index stays at a steady size as a real engine's does.
``blocks_per_s = (blocks stored + blocks removed) / seconds``.

Public API (stable): :func:`measure_ingest_throughput`, :class:`IngestMeasurement`.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from router.kv_event_subscriber import EngineEventSource, KvEventSubscriber
from router.kv_events import (
    BlockRemoved,
    BlockStored,
    EngineBlockHash,
    KvEvent,
    KvEventBatch,
    encode_frames,
)
from router.kv_index import KvIndex


@dataclass(frozen=True, slots=True)
class IngestMeasurement:
    blocks: int
    events: int
    messages: int
    seconds: float
    blocks_per_s: float


def _workload(
    n_blocks: int, block_size: int, blocks_per_event: int, replicas: int, seed: int
) -> list[tuple[str, list[bytes]]]:
    rng = random.Random(seed)
    next_hash = 1
    messages: list[tuple[str, list[bytes]]] = []
    seqs = [0] * replicas
    stored: list[list[list[EngineBlockHash]]] = [[] for _ in range(replicas)]
    blocks = 0
    while blocks < n_blocks:
        r = rng.randrange(replicas)
        events: list[KvEvent] = []
        parent: EngineBlockHash | None = None
        if stored[r] and rng.random() < 0.25:
            parent = stored[r][-1][-1]
        hashes: list[EngineBlockHash] = list(range(next_hash, next_hash + blocks_per_event))
        next_hash += blocks_per_event
        tokens = [rng.randrange(32000) for _ in range(blocks_per_event * block_size)]
        events.append(BlockStored(hashes, parent, tokens, block_size, medium="GPU"))
        stored[r].append(hashes)
        blocks += blocks_per_event
        if len(stored[r]) >= 4:
            victim = stored[r].pop(0)
            events.append(BlockRemoved(victim, medium="GPU"))
            blocks += len(victim)
        frames = encode_frames(f"engine-{r}", seqs[r], KvEventBatch(time.time(), events, 0))
        seqs[r] += 1
        messages.append((f"engine-{r}", frames))
    return messages


def measure_ingest_throughput(
    n_blocks: int = 200_000,
    block_size: int = 16,
    blocks_per_event: int = 8,
    replicas: int = 8,
    seed: int = 0,
) -> IngestMeasurement:
    """Time decode + sequence tracking + index apply over a synthetic event stream."""
    messages = _workload(n_blocks, block_size, blocks_per_event, replicas, seed)
    index = KvIndex("bench-model", block_size)
    sub = KvEventSubscriber(index)
    for r in range(replicas):
        sub.add_engine(EngineEventSource(f"engine-{r}", topic=f"engine-{r}"))
    on_frames = sub.on_frames
    start = time.perf_counter()
    for replica_id, frames in messages:
        on_frames(frames, replica_id)
    seconds = time.perf_counter() - start
    c = index.counters
    blocks = c.blocks_stored + c.blocks_removed + c.duplicate_blocks
    return IngestMeasurement(
        blocks=blocks,
        events=c.events,
        messages=len(messages),
        seconds=seconds,
        blocks_per_s=blocks / seconds if seconds > 0 else float("inf"),
    )
