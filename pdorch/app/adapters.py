"""Which replica has which LoRA adapter loaded, learnt from the engines themselves.

Two sources, as vLLM exposes them:
- `GET /v1/models` of each replica (`AdapterPoller`, every `interval_s` and at once when a
  replica joins): vLLM lists every loaded adapter as a card with `parent` = its base model
  (`id` = the adapter's name, `root` = its path). A successful poll is the replica's whole
  truth: it replaces what was known, so an unloaded adapter leaves routing at the next poll.
- KV events: a `BlockStored` with `lora_name` proves the replica ran that adapter
  (`AdapterLearningSink`, between the event subscriber and the KV index); it is added at once,
  before the next poll confirms it.

`ReplicaAdapters` is pure state (no I/O, no clock); the request path asks `holders(name)` for
`RoutingRequest.eligible` and `known()` for `/v1/models`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from pools.periodic import PeriodicLoop
from router.kv_events import BlockStored, KvEventBatch
from router.kv_index import KvIndex

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_S = 5.0
DEFAULT_POLL_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    """A LoRA adapter as `/v1/models` shows it: its name, base model (`parent`), path (`root`)."""

    name: str
    parent: str
    root: str | None = None


class ReplicaAdapters:
    """Adapters per replica (module docstring): polled lists plus names seen in KV events."""

    def __init__(self) -> None:
        self._listed: dict[str, dict[str, AdapterInfo]] = {}
        self._seen: dict[str, set[str]] = {}
        self._holders: dict[str, frozenset[str]] | None = None  # rebuilt on change
        self._known: list[AdapterInfo] | None = None

    def set_listed(self, replica_id: str, adapters: Iterable[AdapterInfo]) -> None:
        """A successful `/v1/models` poll: the replica's adapters are exactly these."""
        self._listed[replica_id] = {a.name: a for a in adapters}
        self._seen.pop(replica_id, None)
        self._holders = self._known = None

    def saw(self, replica_id: str, name: str) -> None:
        """A KV event says the replica stored blocks for adapter `name`."""
        seen = self._seen.setdefault(replica_id, set())
        if name not in seen:
            seen.add(name)
            self._holders = self._known = None

    def remove(self, replica_id: str) -> None:
        self._listed.pop(replica_id, None)
        self._seen.pop(replica_id, None)
        self._holders = self._known = None

    def loaded(self, replica_id: str) -> frozenset[str]:
        return frozenset(self._listed.get(replica_id, {})) | frozenset(
            self._seen.get(replica_id, ())
        )

    def holders(self, name: str) -> frozenset[str]:
        """Replicas with adapter `name` loaded (empty: none, or an unknown name)."""
        if self._holders is None:
            holders: dict[str, set[str]] = {}
            for rid in set(self._listed) | set(self._seen):
                for adapter in self.loaded(rid):
                    holders.setdefault(adapter, set()).add(rid)
            self._holders = {k: frozenset(v) for k, v in holders.items()}
        return self._holders.get(name, frozenset())

    def known(self, base_model: str) -> list[AdapterInfo]:
        """Every adapter some replica has, by name (one card per name for `/v1/models`)."""
        if self._known is not None:
            return self._known
        cards: dict[str, AdapterInfo] = {}
        for listed in self._listed.values():
            for info in listed.values():
                cards.setdefault(info.name, info)
        for seen in self._seen.values():
            for name in seen:
                cards.setdefault(name, AdapterInfo(name, base_model))
        self._known = [cards[name] for name in sorted(cards)]
        return self._known


def adapters_of_models_list(body: Any) -> list[AdapterInfo]:
    """The adapter cards (those with a `parent`) of a `/v1/models` answer; ValueError if the
    body is not a model list."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise ValueError("not an OpenAI model list")
    adapters = []
    for card in body["data"]:
        if not isinstance(card, dict):
            continue
        name, parent = card.get("id"), card.get("parent")
        if isinstance(name, str) and isinstance(parent, str):
            root = card.get("root")
            adapters.append(AdapterInfo(name, parent, root if isinstance(root, str) else None))
    return adapters


class AdapterLearningSink:
    """A `KvEventSink` that notes each `BlockStored.lora_name` and passes the batch on to the
    KV index (the subscriber's one sink; `router/kv_event_subscriber.py`)."""

    def __init__(self, index: KvIndex, adapters: ReplicaAdapters) -> None:
        self.index = index
        self.adapters = adapters

    def apply_batch(self, replica_id: str, batch: KvEventBatch) -> None:
        for event in batch.events:
            if isinstance(event, BlockStored) and event.lora_name:
                self.adapters.saw(replica_id, event.lora_name)
        self.index.apply_batch(replica_id, batch)

    def clear_replica(self, replica_id: str) -> int:
        return self.index.clear_replica(replica_id)

    def remove_replica(self, replica_id: str) -> int:
        return self.index.remove_replica(replica_id)


class AdapterPoller(PeriodicLoop):
    """Polls every replica's `/v1/models` for its adapters (module docstring)."""

    def __init__(
        self,
        adapters: ReplicaAdapters,
        replicas: Callable[[], Iterable[tuple[str, str]]],
        client: httpx.AsyncClient,
        *,
        interval_s: float = DEFAULT_POLL_INTERVAL_S,
        timeout_s: float = DEFAULT_POLL_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.adapters = adapters
        self.replicas = replicas  # (replica id, base url) of every replica to poll
        self.client = client
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.failures = 0

    async def poll(self, replica_id: str, url: str) -> bool:
        """One replica; False (state kept) when it did not answer a model list."""
        try:
            answer = await self.client.get(url + "/v1/models", timeout=self.timeout_s)
            answer.raise_for_status()
            listed = adapters_of_models_list(answer.json())
        except (httpx.HTTPError, ValueError) as exc:
            self.failures += 1
            log.debug("adapter poll of %s failed: %r", replica_id, exc)
            return False
        if any(rid == replica_id for rid, _ in self.replicas()):  # not removed meanwhile
            self.adapters.set_listed(replica_id, listed)
        return True

    async def run_once(self) -> int:
        """Poll every replica concurrently; returns how many answered."""
        results = await asyncio.gather(*(self.poll(rid, url) for rid, url in self.replicas()))
        return sum(results)
