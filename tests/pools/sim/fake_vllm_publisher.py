"""A stand-in for vLLM's KV event publisher inside its scheduler, for the in-process parity
tests (e2e). It imports vLLM, so import it inside those tests only, never at collection."""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_events import EventBatch, EventPublisher


class FakeKvEventPublisher(EventPublisher):
    """Keeps every published event: the comparison needs each step's events synchronously,
    which vLLM's ZMQ publisher (a socket) cannot promise."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Any] = []

    def publish(self, events: EventBatch) -> None:
        self.events.extend(events.events)

    def shutdown(self) -> None:
        pass
