"""Notices when the router's block keys stop matching what engines actually cache. Pure.

If the router tokenizes differently from the engines (wrong tokenizer files, a changed chat
template, a missing BOS, another block size), the precise index never matches and routing
quietly falls back to load only. This monitor checks the router's predictions against the
engines' own reports:

1. after a request's prompt was sent to ``replica_id`` (and its prefill ran), the router calls
   :meth:`HashMatchMonitor.on_routed` with the prompt's keys (:mod:`router.block_keys`);
2. :meth:`HashMatchMonitor.evaluate` (called periodically with ``now``) checks every prediction
   at least ``check_after_s`` old (default 2 s: time for the prefill to finish and its
   ``BlockStored`` event to arrive): it *matches* when the index -- built from keys recomputed
   from that replica's ``BlockStored`` token ids -- holds the prompt's **last** full-block key
   on that replica. That key depends on every token before it, so any divergence anywhere in the
   prompt shows. (A block already cached before the request needs no new event: the index
   still holds it, so it matches too.)
3. ``match_ratio`` is the share of matches among the last ``window`` checks (default 50); when
   at least ``min_checks`` (default 10) were made and the ratio drops below ``warn_below``
   (default 0.5), ``healthy`` turns False and one warning is logged per transition.

False alarms: a replica that evicts the block within ``check_after_s`` (a tiny KV pool under
heavy load), or a request that failed before prefill (do not record those). Prompts shorter
than one block carry no key and are ignored.

Public API (stable): :class:`HashMatchMonitor`, :class:`HashMismatch`,
:class:`HashMatchCounters`, protocol :class:`BlockHolderIndex` (``has_block``; ``KvIndex``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

log = logging.getLogger(__name__)


class BlockHolderIndex(Protocol):
    def has_block(self, replica_id: str, key: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class HashMismatch:
    replica_id: str
    key: int
    routed_at: float


@dataclass(slots=True)
class HashMatchCounters:
    predictions: int = 0
    matched: int = 0
    mismatched: int = 0
    dropped: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class HashMatchMonitor:
    """Compares predicted keys with the keys engines' ``BlockStored`` events produce."""

    def __init__(
        self,
        *,
        check_after_s: float = 2.0,
        window: int = 50,
        min_checks: int = 10,
        warn_below: float = 0.5,
        max_pending: int = 10_000,
    ) -> None:
        self.check_after_s = check_after_s
        self.min_checks = min_checks
        self.warn_below = warn_below
        self.max_pending = max_pending
        self.counters = HashMatchCounters()
        self._pending: deque[tuple[float, str, int]] = deque()
        self._recent: deque[bool] = deque(maxlen=window)
        self._healthy = True

    def on_routed(self, replica_id: str, keys: Sequence[int], now: float) -> None:
        """The prompt with block ``keys`` was prefilled on ``replica_id`` at ``now``."""
        if not keys:
            return
        self.counters.predictions += 1
        self._pending.append((now, replica_id, keys[-1]))
        if len(self._pending) > self.max_pending:
            self._pending.popleft()
            self.counters.dropped += 1

    def evaluate(self, index: BlockHolderIndex, now: float) -> list[HashMismatch]:
        """Check predictions older than ``check_after_s``; returns the mismatches found."""
        mismatches: list[HashMismatch] = []
        horizon = now - self.check_after_s
        pending = self._pending
        while pending and pending[0][0] <= horizon:
            routed_at, replica_id, key = pending.popleft()
            ok = index.has_block(replica_id, key)
            self._recent.append(ok)
            if ok:
                self.counters.matched += 1
            else:
                self.counters.mismatched += 1
                mismatches.append(HashMismatch(replica_id, key, routed_at))
        self._update_health()
        return mismatches

    @property
    def match_ratio(self) -> float | None:
        """Matches among the last ``window`` checks; None before any check."""
        if not self._recent:
            return None
        return sum(self._recent) / len(self._recent)

    @property
    def healthy(self) -> bool:
        return self._healthy

    def _update_health(self) -> None:
        ratio = self.match_ratio
        if ratio is None or len(self._recent) < self.min_checks:
            return
        healthy = ratio >= self.warn_below
        if self._healthy and not healthy:
            log.warning(
                "router block keys stopped matching engine KV events: %.0f%% of the last %d "
                "routed prompts were found cached where they were sent; check the tokenizer "
                "mode, model directory, chat template and block size",
                100 * ratio,
                len(self._recent),
            )
        elif not self._healthy and healthy:
            log.info("router block keys match engine KV events again (%.0f%%)", 100 * ratio)
        self._healthy = healthy
