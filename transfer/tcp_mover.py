"""The TCP fallback mover: same contract as NIXL, blocks carried by the ZMQ side channel.

For machines without NIXL (or to rule NIXL out when debugging). The owner answers a `Read` with
the blocks as extra ZMQ frames sent without copying from the pool; the puller copies each frame
into its block (in a worker thread for large chunks, so the event loop stays responsive).
A pull is split into chunks of at most `chunk_bytes`, all requested at once, so the owner sends
chunk k+1 while the puller copies chunk k. Every `Read` re-checks the lease like `BeginPull`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from transfer.errors import TransferFailed
from transfer.mover import MoverBase
from transfer.puller import Pull
from transfer.side_channel import Notify, PeerLink, Read, ReadReply, Reply
from transfer.transports import KvTransport

CHUNK_BYTES = 16 << 20
"""Largest data reply (bytes); bounds the memory a pull pins in ZMQ queues at once."""

THREAD_COPY_BYTES = 1 << 20

GATHER_MIN_RUNS = 16
GATHER_MAX_RUN_BYTES = 256 << 10
"""A reply with more than GATHER_MIN_RUNS runs averaging under GATHER_MAX_RUN_BYTES is gathered
into one frame instead of one frame per run."""
"""Chunks at least this big are copied in a worker thread, smaller ones inline."""


class TcpBlockMover(MoverBase):
    """`BlockMover` whose data goes over the side channel's TCP connection."""

    kind = KvTransport.TCP

    def _serve_read(self, request: Read) -> tuple[Reply, Sequence[Any]]:
        # Per-frame cost dominates small blocks, so: runs of adjacent ids go out as one frame
        # each, without copying; ids scattered in small runs are gathered into one buffer first
        # (one extra memcpy, far cheaper than thousands of frames).
        array = self.pool.blocks_array()
        ids = request.block_ids
        runs = _runs(ids)
        if len(runs) > GATHER_MIN_RUNS and len(ids) * self.pool.block_bytes < (
            GATHER_MAX_RUN_BYTES * len(runs)
        ):
            frames: list[Any] = [np.take(array, ids, axis=0).data]
        else:
            frames = [array[start : start + length].data.cast("B") for start, length in runs]
        return ReadReply(seq=request.seq, num_blocks=len(ids)), frames

    def _tick_interval(self) -> float:
        return 0.5

    async def _transfer(self, pull: Pull) -> None:
        link, remote, local = pull.link, pull.remote, pull.local
        request_id, deadline = pull.request_id, pull.deadline
        per_chunk = max(1, CHUNK_BYTES // self.pool.block_bytes)
        chunks = [
            (remote[i : i + per_chunk], local[i : i + per_chunk])
            for i in range(0, len(remote), per_chunk)
        ]
        tasks = [
            asyncio.ensure_future(self._read_chunk(link, r, loc, request_id, deadline))
            for r, loc in chunks
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if pull.notify:
            await self._ask(link, Notify(seq=0, request_id=request_id), deadline, request_id)

    async def _read_chunk(
        self,
        link: PeerLink,
        remote: list[int],
        local: list[int],
        request_id: str,
        deadline: float,
    ) -> None:
        hold_s = self._pull_hold_s(deadline)
        message = Read(seq=0, request_id=request_id, block_ids=remote, hold_s=hold_s)
        reply, frames = await self._ask(link, message, deadline, request_id)
        block_bytes = self.pool.block_bytes
        size = sum(len(frame.buffer) for frame in frames)
        if not isinstance(reply, ReadReply) or size != len(local) * block_bytes:
            raise TransferFailed(
                f"{link.peer} sent {size} bytes, expected {len(local)} blocks of {block_bytes}",
                peer=str(link.peer),
                request_id=request_id,
            )
        array = self.pool.blocks_array()

        def copy() -> None:
            # The frames are the asked blocks back to back; copy them in runs of adjacent
            # local ids.
            position = 0
            for frame in frames:
                data = np.frombuffer(frame.buffer, dtype=np.uint8).reshape(-1, block_bytes)
                ids = local[position : position + len(data)]
                runs = _runs(ids)
                if len(runs) > GATHER_MIN_RUNS:
                    array[np.asarray(ids)] = data  # one scatter in C
                else:
                    offset = 0
                    for start, length in runs:
                        array[start : start + length] = data[offset : offset + length]
                        offset += length
                position += len(data)

        if len(local) * block_bytes >= THREAD_COPY_BYTES:
            await asyncio.to_thread(copy)
        else:
            copy()


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """(first id, length) of each run of consecutive ids, in order."""
    out: list[tuple[int, int]] = []
    for i in ids:
        if out and out[-1][0] + out[-1][1] == i:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((i, 1))
    return out
