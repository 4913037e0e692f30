"""`PeerSync`: several coordinators over one fleet converge on each other's token load.

Each coordinator ingests every engine's KV events itself, so only the token load (which
requests this coordinator sent where, and how far along they are) must be shared. `TokenLoad`
already exports each local change as a `TokenLoadDelta` carrying the entry's *absolute* state
and a per-origin version, and `apply_delta` keeps the highest version: duplicates and reordering
are harmless. This component is the transport around that:

- **Send.** Local deltas (from `publish(deltas)` or a `source` drained on every flush) go out
  as one msgspec message per flush on a ZMQ XPUB socket: every `flush_interval_s` (20 ms), or
  at once after `flush_soon()` (a lifecycle change) unless the last send is younger than
  `min_flush_gap_s` (bursts coalesce). Nothing to send for `heartbeat_interval_s` → a heartbeat.
- **Repair.** Every `snapshot_interval_s`, and whenever a peer subscribes (XPUB sees the
  subscription), the full set of this coordinator's live entries is re-sent. A receiver drops
  the entries of that sender it still holds but the snapshot lacks (and whose version is at most
  the snapshot's `high_water`): a lost removal, a late joiner and a slow-joiner's first
  messages are all repaired within one snapshot interval.
- **Receive.** A SUB socket connected to every peer; messages from this coordinator's own
  origin are ignored. Each entry becomes a `TokenLoadDelta` stamped with the receiver's clock
  and goes to `on_delta(delta, now)` (`TokenLoad.apply_delta`).
- **Expire.** A peer silent for `peer_timeout_s` (3 s; heartbeats keep live peers fresh),
  one that says `bye` on stop, or one that restarted (new incarnation) has its entries dropped
  through `on_forget(request_id, replica_id, now)` (`TokenLoad.on_finished` on that key, which
  leaves a tombstone at the entry's version: late messages from the dead peer cannot resurrect
  it, while any newer change from it still applies).

Known limit: a peer expired while it was alive (a > 3 s stall or partition) has its unchanged
entries counted again only when they next change; metrics reconciliation bounds the error.

Everything runs on the coordinator's event loop (no locks): `on_delta`/`on_forget` are called
from it, between requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec
import zmq
import zmq.asyncio

from pdorch.sync.settings import SyncSettings
from pdorch.sync.wire import TOPIC, MessageKind, SyncMessage, WireEntry, decode_message
from pdorch.sync.wire import encode_message as _encode
from router.token_load import TokenLoad, TokenLoadDelta

log = logging.getLogger(__name__)

_Key = tuple[str, str]  # (request_id, replica_id)
OnDelta = Callable[[TokenLoadDelta, float], object]
OnForget = Callable[[str, str, float], object]
DeltaSource = Callable[[], Iterable[TokenLoadDelta]]


@dataclass(slots=True)
class PeerSyncStats:
    """Counters for `/metrics` and `/admin`: what was sent, received, repaired, expired."""

    messages_sent: int = 0
    entries_sent: int = 0
    snapshots_sent: int = 0
    messages_received: int = 0
    entries_received: int = 0
    entries_applied: int = 0  # received entries that changed this coordinator's view
    own_messages_ignored: int = 0
    bad_messages: int = 0
    seq_gaps: int = 0
    entries_forgotten: int = 0
    peers_expired: int = 0


@dataclass(slots=True)
class _Peer:
    incarnation: str
    last_seq: int
    last_seen: float
    live: dict[_Key, int] = field(default_factory=dict)  # key -> version, entries we hold


def _bind_endpoint(endpoint: str) -> str:
    """`tcp://host:0` → `tcp://host:*` (ZMQ's spelling of "any free port")."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        return endpoint[:-2] + ":*"
    return endpoint


class PeerSync:
    """Shares this coordinator's token-load deltas with its peers and applies theirs.

    `start()`/`stop()` (or `async with`); `publish(deltas)` and/or a `source`; `flush_soon()`
    after a lifecycle change; `endpoint` is the bound PUB endpoint (with the real port).
    """

    def __init__(
        self,
        settings: SyncSettings,
        origin: str,
        on_delta: OnDelta,
        on_forget: OnForget,
        *,
        source: DeltaSource | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.origin = settings.origin or origin
        self.incarnation = uuid.uuid4().hex[:12]
        self.stats = PeerSyncStats()
        self._on_delta = on_delta
        self._on_forget = on_forget
        self._source = source
        self._clock = clock
        self._own: dict[_Key, WireEntry] = {}  # this coordinator's live entries, as sent
        self._pending: list[WireEntry] = []
        self._high_water = 0
        self._seq = 0
        self._peers: dict[str, _Peer] = {}
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self._connected: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._snapshot_due = True
        self._last_send = float("-inf")
        self._last_snapshot = float("-inf")
        self._endpoint: str | None = None

    @classmethod
    def for_token_load(
        cls,
        token_load: TokenLoad,
        settings: SyncSettings,
        *,
        source: DeltaSource | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> PeerSync:
        """The usual wiring: drain `token_load.export_deltas()` (or `source`, e.g. the
        coordinator's `export_token_load_deltas`) on every flush, apply peers' deltas with
        `apply_delta`, drop expired peers' entries with `on_finished`."""

        def forget(request_id: str, replica_id: str, now: float) -> None:
            token_load.on_finished(request_id, now, replica_id)

        return cls(
            settings,
            token_load.origin,
            on_delta=token_load.apply_delta,
            on_forget=forget,
            source=source or token_load.export_deltas,
            clock=clock,
        )

    # ---- lifecycle ---------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The bound PUB endpoint (port resolved); peers connect here."""
        if self._endpoint is None:
            raise RuntimeError("PeerSync is not started")
        return self._endpoint

    async def start(self) -> None:
        if self._ctx is not None:
            return
        self._ctx = zmq.asyncio.Context()
        pub = self._ctx.socket(zmq.XPUB)
        pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every new subscriber is seen: send it a snapshot
        pub.setsockopt(zmq.SNDHWM, 100_000)
        pub.setsockopt(zmq.LINGER, 200)
        pub.bind(_bind_endpoint(self.settings.bind))
        self._endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
        self._pub, self._sub = pub, sub
        for peer in self.settings.peers:
            self.add_peer(peer)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._send_loop(), name="peer-sync-send"),
            loop.create_task(self._receive_loop(), name="peer-sync-receive"),
            loop.create_task(self._subscription_loop(), name="peer-sync-subscriptions"),
        ]

    async def stop(self, *, say_bye: bool = True) -> None:
        """Flush what is pending, tell peers to drop this coordinator's entries (`bye`), close.

        `say_bye=False` leaves silently (peers expire this coordinator after `peer_timeout_s`).
        """
        if self._ctx is None:
            return
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if say_bye:
            with contextlib.suppress(zmq.ZMQError):
                self._flush(self._clock())
                self._send("bye", [])
        assert self._pub is not None and self._sub is not None
        self._sub.close(linger=0)
        self._pub.close(linger=200 if say_bye else 0)
        self._ctx.term()
        self._ctx = self._pub = self._sub = None
        self._connected.clear()

    async def __aenter__(self) -> PeerSync:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def add_peer(self, endpoint: str) -> None:
        """Connect to one more coordinator (idempotent; own endpoint skipped)."""
        if self._sub is None:
            raise RuntimeError("PeerSync is not started")
        if endpoint in self._connected or endpoint in (self.settings.bind, self._endpoint):
            return
        self._sub.connect(endpoint)
        self._connected.add(endpoint)

    def peers(self) -> dict[str, int]:
        """Peer origin → entries of it this coordinator holds."""
        return {origin: len(peer.live) for origin, peer in self._peers.items()}

    # ---- sending -----------------------------------------------------------------------------

    def publish(self, deltas: Iterable[TokenLoadDelta]) -> None:
        """Queue local deltas for the next flush (other origins' records are skipped)."""
        for delta in deltas:
            if delta.origin != self.origin:
                continue
            entry = WireEntry(
                delta.request_id,
                delta.replica_id,
                delta.version,
                delta.removed,
                delta.prefill_tokens,
                delta.decode_blocks,
            )
            key = (delta.request_id, delta.replica_id)
            if delta.removed:
                self._own.pop(key, None)
            else:
                self._own[key] = entry
            self._high_water = max(self._high_water, delta.version)
            self._pending.append(entry)

    def flush_soon(self) -> None:
        """A lifecycle change happened: send without waiting for the next interval."""
        self._wake.set()

    def _flush(self, now: float) -> None:
        if self._source is not None:
            self.publish(self._source())
        if self._pending:
            entries, self._pending = self._pending, []
            self._send("delta", entries)
        if self._snapshot_due or now - self._last_snapshot >= self.settings.snapshot_interval_s:
            self._snapshot_due = False
            self._last_snapshot = now
            self._send("snapshot", list(self._own.values()))
            self.stats.snapshots_sent += 1
        elif now - self._last_send >= self.settings.heartbeat_interval_s:
            self._send("heartbeat", [])

    def _send(self, kind: MessageKind, entries: list[WireEntry]) -> None:
        assert self._pub is not None
        self._seq += 1
        message = SyncMessage(
            self.origin, self.incarnation, self._seq, kind, self._high_water, entries
        )
        try:
            self._pub.send_multipart([TOPIC, _encode(message)], flags=zmq.NOBLOCK)
        except zmq.Again:  # no subscriber ever blocks us; a full queue drops (snapshots repair)
            return
        self._last_send = self._clock()
        self.stats.messages_sent += 1
        self.stats.entries_sent += len(entries)

    async def _send_loop(self) -> None:
        settings = self.settings
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), settings.flush_interval_s)
            gap = settings.min_flush_gap_s - (self._clock() - self._last_send)
            if gap > 0:
                await asyncio.sleep(gap)
            self._wake.clear()
            now = self._clock()
            try:
                self._flush(now)
                self._expire_silent_peers(now)
            except Exception:  # a bad callback must not stop sharing
                log.exception("peer sync flush failed")

    async def _subscription_loop(self) -> None:
        assert self._pub is not None
        while True:
            frame = await self._pub.recv()
            if frame[:1] == b"\x01":  # a (re)subscription: that peer needs our full state
                self._snapshot_due = True
                self._wake.set()

    # ---- receiving ---------------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        assert self._sub is not None
        while True:
            frames = await self._sub.recv_multipart()
            try:
                self.handle_payload(frames[-1], self._clock())
            except Exception:
                log.exception("peer sync message failed")

    def handle_payload(self, payload: bytes, now: float) -> None:
        """Apply one received message (the receive loop's body; public for tests and tools)."""
        try:
            message = decode_message(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.stats.bad_messages += 1
            return
        if message.sender == self.origin:
            self.stats.own_messages_ignored += 1
            return
        self.stats.messages_received += 1
        peer = self._peers.get(message.sender)
        if peer is not None and peer.incarnation != message.incarnation:
            self._forget_peer(message.sender, now)  # restarted: its old requests are gone
            peer = None
        if peer is None:
            peer = _Peer(message.incarnation, message.seq, now)
            self._peers[message.sender] = peer
        else:
            if message.seq > peer.last_seq + 1:
                self.stats.seq_gaps += 1
            peer.last_seq = max(peer.last_seq, message.seq)
            peer.last_seen = now
        if message.kind == "bye":
            self._forget_peer(message.sender, now)
            return
        self.stats.entries_received += len(message.entries)
        for entry in message.entries:
            self._apply(message.sender, peer, entry, now)
        if message.kind == "snapshot":
            present = {(e.request_id, e.replica_id) for e in message.entries}
            gone = [
                key
                for key, version in peer.live.items()
                if key not in present and version <= message.high_water
            ]
            for key in gone:
                del peer.live[key]
                self._forget(key, now)

    def _apply(self, sender: str, peer: _Peer, entry: WireEntry, now: float) -> None:
        key = (entry.request_id, entry.replica_id)
        known = peer.live.get(key)
        if entry.removed:
            if known is not None and entry.version > known:
                del peer.live[key]
        elif known is None or entry.version > known:
            peer.live[key] = entry.version
        delta = TokenLoadDelta.model_construct(
            origin=sender,
            version=entry.version,
            request_id=entry.request_id,
            replica_id=entry.replica_id,
            removed=entry.removed,
            prefill_tokens=entry.prefill_tokens,
            decode_blocks=entry.decode_blocks,
            updated_at=now,
        )
        if self._on_delta(delta, now):  # TokenLoad.apply_delta: True when it changed
            self.stats.entries_applied += 1

    def _expire_silent_peers(self, now: float) -> None:
        horizon = now - self.settings.peer_timeout_s
        for origin in [o for o, p in self._peers.items() if p.last_seen < horizon]:
            silent = now - self._peers[origin].last_seen
            log.warning("peer coordinator %s silent for %.1fs: its load expires", origin, silent)
            self._forget_peer(origin, now)
            self.stats.peers_expired += 1

    def _forget_peer(self, origin: str, now: float) -> None:
        peer = self._peers.pop(origin, None)
        if peer is None:
            return
        for key in peer.live:
            self._forget(key, now)

    def _forget(self, key: _Key, now: float) -> None:
        self.stats.entries_forgotten += 1
        self._on_forget(key[0], key[1], now)
