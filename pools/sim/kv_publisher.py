"""KV-cache events over ZMQ, on vLLM's wire (a publisher that vLLM's subscribers cannot tell apart).

Wire format (vLLM 0.32 `ZmqEventPublisher`, checked against the real captures in
`tests/fixtures/vllm/`):

- PUB socket, one multipart message per engine step that changed the cache:
  `[topic (UTF-8), seq (8-byte big-endian, from 0 per publisher), payload (msgpack)]`,
  payload = `[ts, [event, ...], data_parallel_rank]`.
- bind or connect: the endpoint is *bound* only when it contains `*` or `::` or is
  `ipc://` / `inproc://`; any other endpoint (e.g. `tcp://127.0.0.1:5557`) is *connected*, so
  one subscriber can bind and many engines connect to it.
- replay: a ROUTER socket (always bound). A DEALER sends `[b"", start_seq (8 bytes BE)]`; the
  publisher answers `[b"", topic, seq, payload]` for every buffered batch with seq >= start_seq,
  then `[b"", b"", seq=-1 (8 bytes 0xff), b""]`. The buffer keeps the last `buffer_steps` batches.

Sending never blocks the engine: PUB drops when its high-water mark is reached (as vLLM's does),
and replay requests are served by one asyncio task per publisher.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgspec
import zmq
import zmq.asyncio

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule: bind wildcard and ipc/inproc endpoints, connect to the rest."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def encode_event_batch(
    ts: float, events: Sequence[Any], data_parallel_rank: int = 0, encoder: Any = None
) -> bytes:
    """The msgpack payload `[ts, [event, ...], data_parallel_rank]`.

    `events` are msgspec structs tagged with `"type"` (the engine core's event classes) or plain
    dicts whose first key is `"type"`; both encode as msgpack maps with `type` first.
    """
    enc = encoder or _ENCODER
    payload: bytes = enc.encode((ts, list(events), data_parallel_rank))
    return payload


_ENCODER = msgspec.msgpack.Encoder()


class ZmqKvEventPublisher:
    """One engine's KV-event publisher (PUB + optional replay ROUTER)."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "kv-events",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        data_parallel_rank: int = 0,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic_bytes = topic.encode()
        self.data_parallel_rank = data_parallel_rank
        self._ctx = context or zmq.Context.instance()
        self._encoder = msgspec.msgpack.Encoder()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._pub: zmq.Socket[bytes] = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.set_hwm(hwm)
        if is_bind_endpoint(endpoint):
            self._pub.bind(endpoint)
        else:
            self._pub.connect(endpoint)
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        if replay_endpoint is not None:
            actx = zmq.asyncio.Context.shadow(self._ctx.underlying)
            self._replay = actx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
        self._closed = False

    @property
    def next_seq(self) -> int:
        return self._seq

    def start(self) -> None:
        """Start serving replay requests (needs a running event loop)."""
        if self._replay is not None and self._replay_task is None:
            self._replay_task = asyncio.get_running_loop().create_task(self._serve_replay())

    def publish(self, events: Sequence[Any], ts: float | None = None) -> int:
        """Send one batch; returns its seq. Never blocks (drops at the high-water mark)."""
        payload = encode_event_batch(
            time.time() if ts is None else ts, events, self.data_parallel_rank, self._encoder
        )
        return self.publish_payload(payload)

    def publish_payload(self, payload: bytes) -> int:
        seq = self._seq
        self._seq += 1
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart(
                (self.topic_bytes, seq.to_bytes(8, "big"), payload), zmq.NOBLOCK
            )
        self._buffer.append((seq, payload))
        return seq

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        sock = self._replay
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3:
                continue  # vLLM ignores malformed replay requests too
            client_id, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= start_seq:
                    await sock.send_multipart(
                        (client_id, b"", self.topic_bytes, seq.to_bytes(8, "big"), payload)
                    )
            await sock.send_multipart((client_id, b"", b"", END_SEQ, b""))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
        if self._replay is not None:
            self._replay.close(linger=0)
        self._pub.close(linger=0)
