"""Token load: the work left on each replica, tracked through every request's lifecycle.

A replica's remaining work is (a) the prefill tokens admitted to it that are not cached and not
yet prefilled, and (b) the KV blocks of the sequences it is decoding. Cache overlap only matters
because it shrinks (a); this tracker is what lets a policy see (a) and (b) instead of request
counts (docs/DESIGN.md, "Routing").

Lifecycle, per (request, replica) entry; every call is idempotent and takes `now`:

    on_admitted(prompt_tokens, uncached_tokens, decodes)  prefill_tokens = uncached_tokens
    on_prefill_done                                        prefill_tokens = 0
                                                           decode_blocks = ceil(prompt / bs)
                                                           (a prefill-only leg ends here)
    on_reserved(prompt_tokens)                             decode_blocks = ceil(prompt / bs),
                                                           reserved (the engine has not seen
                                                           the request yet: a P/D decode side
                                                           before its leg is sent)
    on_leg_sent                                            reserved → held by the engine
    on_tokens(generated_total)                             decode_blocks =
                                                           ceil((prompt + generated) / bs)
    on_finished / on_aborted                               entry removed (tombstoned)

`on_admitted` / `on_reserved` also take the request's `max_tokens`: `load(r).decoding` lists
every decoding entry's remaining output, `max(0, max_tokens - generated)` (-1 without one),
with its decode blocks: the straggler-aware signal `token_load`'s `remaining_decode` reads.

`generated_total` is cumulative, so a duplicated or reordered token event never double counts;
`on_tokens`/`on_prefill_done` for an unknown entry are ignored, and a tombstone keeps a late
delta from another coordinator from resurrecting a finished request.
Per-replica sums are kept incrementally and are never negative.

Reconciliation with scraped `/metrics` (`observe_metrics`), the documented rule:

1. **Idle engine drops stale entries.** When a scrape reports `vllm:num_requests_running == 0`
   and `vllm:num_requests_waiting == 0`, every entry on that replica whose last update is older
   than `stale_after_s` (default 30 s) is dropped: its finish was lost (client gone, coordinator
   restarted). Younger entries stay, because the scrape may predate their admission.
2. **KV usage bounds the decode estimate.** When the last scrape is at least as new as the last
   tracked change on the replica and the KV capacity is known, the reported decode blocks are
   `min(tracked_held, ceil(kv_usage * kv_capacity_blocks)) + reserved`: the engine cannot be
   decoding more KV than it holds (tracked blocks double count prefixes shared between
   sequences), but blocks *reserved* for a decode leg not yet sent are not in the engine at all,
   so no scrape can bound them (clipping them erased every P/D decode reservation at each
   scrape and piled decode picks onto the replicas whose reservations were erased).
3. Tombstones older than `tombstone_ttl_s` (default 300 s) are forgotten on every scrape.

Sharing between coordinator replicas (`export_deltas`, `apply_delta`) and the entry store
are in router/token_load_store.py (`TokenLoadStore`, the base class).
"""

from __future__ import annotations

import math

from router.replica_state import ReplicaLoad
from router.token_load_entries import EngineMetrics as _Metrics
from router.token_load_entries import Entry as _Entry
from router.token_load_entries import TokenLoadDelta
from router.token_load_entries import Totals as _Totals
from router.token_load_entries import blocks as _blocks
from router.token_load_store import CHANGE_WINDOW, TokenLoadStore

__all__ = ["CHANGE_WINDOW", "TokenLoad", "TokenLoadDelta"]


class TokenLoad(TokenLoadStore):
    """Per-replica token load from request lifecycles, reconciled with engine metrics."""

    # ---- lifecycle ---------------------------------------------------------------------------

    def on_admitted(
        self,
        request_id: str,
        replica_id: str,
        now: float,
        *,
        prompt_tokens: int,
        uncached_tokens: int,
        block_size: int,
        decodes: bool = True,
        max_tokens: int | None = None,
    ) -> None:
        """The request was sent to `replica_id`; `uncached_tokens` of its prompt need prefill.

        `decodes=False` for a prefill-only leg (disaggregated), whose entry ends at prefill.
        `max_tokens`: the request's output bound, for the remaining-decode signal.
        """
        key = (request_id, replica_id)
        if key in self._entries:
            return
        # A retry of a finished/aborted request on the same replica is a new life of the entry.
        self._tombstones.pop(key, None)
        uncached = min(max(0, uncached_tokens), max(0, prompt_tokens))
        entry = _Entry(
            prompt_tokens=max(0, prompt_tokens),
            block_size=block_size,
            prefill_tokens=uncached,
            decodes=decodes,
            generated=0,
            decode_blocks=0,
            updated_at=now,
            origin=self.origin,
            version=self._next_version(),
            max_tokens=max_tokens,
        )
        self._insert(key, entry, now)
        self._dirty.add(key)

    def on_prefill_done(self, request_id: str, replica_id: str, now: float) -> None:
        """The prompt is in the replica's KV (first token seen, or the prefill leg returned)."""
        key = (request_id, replica_id)
        entry = self._entries.get(key)
        if entry is None or entry.origin != self.origin:
            return
        if not entry.decodes:
            self._remove(key, now)
            return
        self._set(key, entry, now, prefill_tokens=0, generated=entry.generated)

    def on_reserved(
        self,
        request_id: str,
        replica_id: str,
        now: float,
        *,
        prompt_tokens: int,
        block_size: int,
        max_tokens: int | None = None,
    ) -> None:
        """`replica_id` will decode the request once its leg is sent: its whole prompt's KV is
        promised to it now (no prefill tokens), and no scrape bounds it until `on_leg_sent`."""
        key = (request_id, replica_id)
        if key in self._entries:
            return
        self._tombstones.pop(key, None)
        prompt = max(0, prompt_tokens)
        entry = _Entry(
            prompt_tokens=prompt,
            block_size=block_size,
            prefill_tokens=0,
            decodes=True,
            generated=0,
            decode_blocks=_blocks(prompt, block_size),
            updated_at=now,
            origin=self.origin,
            version=self._next_version(),
            reserved=True,
            max_tokens=max_tokens,
        )
        self._insert(key, entry, now)
        self._dirty.add(key)

    def on_leg_sent(self, request_id: str, replica_id: str, now: float) -> None:
        """The reserved decode leg reached its engine, which now holds the blocks."""
        key = (request_id, replica_id)
        entry = self._entries.get(key)
        if entry is None or not entry.reserved or entry.origin != self.origin:
            return
        totals = self._totals.setdefault(replica_id, _Totals())
        totals.reserved_blocks = max(0, totals.reserved_blocks - entry.decode_blocks)
        entry.reserved = False
        self._set(key, entry, now, prefill_tokens=0, generated=entry.generated)

    def on_tokens(self, request_id: str, replica_id: str, now: float, generated_total: int) -> None:
        """`generated_total` output tokens exist so far (cumulative, so duplicates are harmless)."""
        key = (request_id, replica_id)
        entry = self._entries.get(key)
        if entry is None or not entry.decodes or entry.origin != self.origin:
            return
        generated = max(entry.generated, generated_total)
        if entry.prefill_tokens == 0 and generated == entry.generated and entry.decode_blocks:
            return
        self._set(key, entry, now, prefill_tokens=0, generated=generated)

    def on_finished(self, request_id: str, now: float, replica_id: str | None = None) -> None:
        """The request completed; its load leaves `replica_id` (or every replica it was on)."""
        for key in self._keys_of(request_id, replica_id):
            self._remove(key, now)

    def on_aborted(self, request_id: str, now: float, replica_id: str | None = None) -> None:
        """The request was cancelled or failed: release everything it held."""
        self.on_finished(request_id, now, replica_id)

    def remove_replica(self, replica_id: str, now: float) -> None:
        """The replica went away: forget its entries and metrics."""
        for key in list(self._by_replica.get(replica_id, ())):
            self._remove(key, now)
        self._by_replica.pop(replica_id, None)
        self._totals.pop(replica_id, None)
        self._metrics.pop(replica_id, None)
        self._changed(replica_id)

    # ---- metrics reconciliation --------------------------------------------------------------

    def observe_metrics(
        self,
        replica_id: str,
        now: float,
        *,
        num_running: int,
        num_waiting: int,
        kv_usage: float,
        kv_capacity_blocks: int = 0,
    ) -> int:
        """Record one `/metrics` scrape and apply the reconciliation rule (module docstring).

        Returns the number of stale entries dropped.
        """
        capacity = kv_capacity_blocks
        previous = self._metrics.get(replica_id)
        if capacity <= 0 and previous is not None:
            capacity = previous.kv_capacity_blocks
        self._changed(replica_id)
        self._metrics[replica_id] = _Metrics(
            num_running=max(0, num_running),
            num_waiting=max(0, num_waiting),
            kv_usage=min(1.0, max(0.0, kv_usage)),
            kv_capacity_blocks=max(0, capacity),
            sampled_at=now,
        )
        dropped = 0
        if num_running == 0 and num_waiting == 0:
            horizon = now - self.stale_after_s
            for key in list(self._by_replica.get(replica_id, ())):
                if self._entries[key].updated_at < horizon:
                    self._remove(key, now)
                    dropped += 1
        self._forget_old_tombstones(now)
        return dropped

    # ---- reading -----------------------------------------------------------------------------

    def load(self, replica_id: str, now: float) -> ReplicaLoad:
        """The replica's load as policies see it (decode blocks bounded by fresh KV usage).

        The returned object is shared until the replica's load next changes: read it only.
        """
        cached = self._load_cache.get(replica_id)
        if cached is not None:
            return cached
        load = self._compute_load(replica_id)
        self._load_cache[replica_id] = load
        return load

    def _decoding(self, replica_id: str) -> tuple[tuple[int, int], ...]:
        """`ReplicaLoad.decoding`: (remaining output tokens, decode blocks) of every entry that
        decodes on the replica, remaining = max(0, max_tokens - generated), -1 when the request
        gave no `max_tokens`. `generated` is as fresh as the last token event (the lifecycle
        sends one per new KV block, so it lags by under one block)."""
        keys = self._by_replica.get(replica_id)
        if not keys:
            return ()
        entries = self._entries
        out: list[tuple[int, int]] = []
        for key in keys:
            e = entries[key]
            if not e.decodes:
                continue
            bound = e.max_tokens
            remaining = -1 if bound is None else max(0, bound - e.generated)
            out.append((remaining, e.decode_blocks))
        out.sort()  # sets iterate in hash order: sorted, so equal states give equal loads
        return tuple(out)

    def _compute_load(self, replica_id: str) -> ReplicaLoad:
        totals = self._totals.get(replica_id)
        metrics = self._metrics.get(replica_id)
        prefill = totals.prefill_tokens if totals else 0
        decode = totals.decode_blocks if totals else 0
        requests = totals.requests if totals else 0
        decoding = self._decoding(replica_id)
        if metrics is None:
            return ReplicaLoad(prefill, decode, requests, decoding=decoding)
        last_change = totals.last_change if totals else float("-inf")
        if metrics.kv_capacity_blocks > 0 and metrics.sampled_at >= last_change:
            reserved = totals.reserved_blocks if totals else 0
            bound = math.ceil(metrics.kv_usage * metrics.kv_capacity_blocks - 1e-9)
            decode = min(decode - reserved, bound) + reserved
        return ReplicaLoad(
            prefill,
            decode,
            requests,
            metrics.kv_usage,
            metrics.num_running,
            metrics.num_waiting,
            metrics.kv_capacity_blocks,
            decoding,
        )

    def tracked_load(self, replica_id: str) -> ReplicaLoad:
        """The replica's load from request lifecycles alone (no metrics bound, no scrape
        fields): what two callers that drive the same events must agree on."""
        totals = self._totals.get(replica_id)
        if totals is None:
            return ReplicaLoad()
        return ReplicaLoad(totals.prefill_tokens, totals.decode_blocks, totals.requests)

    def tracked_requests(self, replica_id: str | None = None) -> int:
        """Live entries (on one replica, or overall)."""
        if replica_id is None:
            return len(self._entries)
        return len(self._by_replica.get(replica_id, ()))
