"""The fleet: every replica by pool, their health, and change events for the coordinator.

Pure state (no I/O, `now` passed in): the health checker, the metrics scraper and the
request path feed it observations; listeners turn its events into router updates (KV event
subscriber add/remove engine, token-load removal and `/metrics` reconciliation). Keeping the
rules here means the same ejection logic runs in the coordinator and in tests without sockets.

Ejection rule: a replica is ejected (HEALTHY → UNHEALTHY) after N *consecutive* failures of
one kind, N from `HealthPolicy` (connection errors: 1, since a refused connection means the
process is gone; timeouts: 2; HTTP 5xx: 3, since vLLM answers 500 for one request's failed KV
load while staying healthy). `/health` probes: a refused connection or a non-200 answer ejects
at once (`probe_failures_to_eject`: 1), a probe that timed out only the second in a row
(`probe_timeouts_to_eject`: 2): on a starved host one late probe is common (seen in the chaos
and proxy benches at load 15-35: a healthy replica ejected, and with both decode replicas out at
once every client got 503), while a hung engine still leaves routing in about two probe rounds
of `interval_s + timeout_s` (~1.5 s with the defaults; the target is 3 s). Any success resets
the counts. An UNHEALTHY replica comes back
after `probe_successes_to_restore` consecutive good `/health` probes; request-path successes
cannot restore it (it gets no requests while ejected).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from pools.replica import Replica, ReplicaEndpoint, ReplicaMetrics, ReplicaState

log = logging.getLogger(__name__)


class FailureKind(StrEnum):
    """Why a request or probe to a replica failed."""

    CONNECTION = "connection"
    TIMEOUT = "timeout"
    HTTP_5XX = "http_5xx"


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """How many consecutive failures eject a replica, and how many probes restore it."""

    connection_failures_to_eject: int = 1
    timeout_failures_to_eject: int = 2
    http_failures_to_eject: int = 3
    probe_failures_to_eject: int = 1
    probe_timeouts_to_eject: int = 2
    probe_successes_to_restore: int = 1

    def threshold(self, kind: FailureKind) -> int:
        if kind is FailureKind.CONNECTION:
            return max(1, self.connection_failures_to_eject)
        if kind is FailureKind.TIMEOUT:
            return max(1, self.timeout_failures_to_eject)
        return max(1, self.http_failures_to_eject)


@dataclass(frozen=True, slots=True)
class ReplicaAdded:
    replica: Replica
    now: float


@dataclass(frozen=True, slots=True)
class ReplicaRemoved:
    replica: Replica
    now: float


@dataclass(frozen=True, slots=True)
class ReplicaHealthChanged:
    replica: Replica
    old: ReplicaState
    new: ReplicaState
    reason: str
    now: float


@dataclass(frozen=True, slots=True)
class ReplicaMetricsUpdated:
    replica: Replica
    metrics: ReplicaMetrics
    now: float


FleetEvent = ReplicaAdded | ReplicaRemoved | ReplicaHealthChanged | ReplicaMetricsUpdated
FleetListener = Callable[[FleetEvent], None]


class Fleet:
    """Replicas by id, grouped by pool; fires a `FleetEvent` for every change."""

    def __init__(self, policy: HealthPolicy | None = None) -> None:
        self.policy = policy or HealthPolicy()
        self._replicas: dict[str, Replica] = {}
        self._listeners: list[FleetListener] = []
        # per-pool id-ordered lists, rebuilt only when membership changes: the request path
        # asks for a pool's replicas on every request
        self._by_pool: dict[str | None, list[Replica]] | None = None

    # ---- listeners ---------------------------------------------------------------------------

    def subscribe(self, listener: FleetListener) -> Callable[[], None]:
        """Call `listener(event)` on every change; returns a function that unsubscribes."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def _emit(self, event: FleetEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # one broken listener must not stop routing updates
                log.exception("fleet listener %r failed on %s", listener, type(event).__name__)

    # ---- membership --------------------------------------------------------------------------

    def add_replica(
        self, endpoint: ReplicaEndpoint, now: float, healthy: bool = True, pending: bool = False
    ) -> Replica:
        """Add a replica (HEALTHY unless `healthy=False`; PENDING, not routable, until
        `admit` with `pending=True`); KeyError if its id is taken."""
        if endpoint.replica_id in self._replicas:
            raise KeyError(f"replica {endpoint.replica_id!r} already exists")
        replica = Replica(
            endpoint=endpoint, healthy=healthy, pending=pending, state_since=now, added_at=now
        )
        self._replicas[endpoint.replica_id] = replica
        self._by_pool = None
        self._emit(ReplicaAdded(replica, now))
        return replica

    def remove_replica(self, replica_id: str, now: float) -> Replica:
        """Remove a replica; KeyError if unknown."""
        replica = self._replicas.pop(replica_id, None)
        if replica is None:
            raise KeyError(f"unknown replica {replica_id!r}")
        self._by_pool = None
        self._emit(ReplicaRemoved(replica, now))
        return replica

    def move_replica(self, replica_id: str, to_pool: str, now: float) -> Replica:
        """Re-label a replica into `to_pool` (a role switch, no restart): fires
        `ReplicaRemoved` then `ReplicaAdded`, so listeners drop its old-pool routing state and
        take it up in the new pool. Its health and failure counts carry over, draining ends.
        KeyError if unknown; ValueError if the replica is not `switchable`."""
        replica = self._require(replica_id)
        if replica.pool == to_pool:
            return replica
        if not replica.endpoint.switchable:
            raise ValueError(f"replica {replica_id!r} is not role-agnostic (switchable)")
        self.remove_replica(replica_id, now)
        moved = Replica(
            endpoint=dataclasses.replace(replica.endpoint, pool=to_pool),
            healthy=replica.healthy,
            state_since=now,
            added_at=replica.added_at,
            metrics=replica.metrics,
        )
        self._replicas[replica_id] = moved
        self._by_pool = None
        self._emit(ReplicaAdded(moved, now))
        return moved

    # ---- reading -----------------------------------------------------------------------------

    def get(self, replica_id: str) -> Replica | None:
        return self._replicas.get(replica_id)

    def replicas(self, pool: str | None = None) -> list[Replica]:
        """Replicas (of `pool`, or all) in id order (a new list; the replicas are live)."""
        if self._by_pool is None:
            ordered = [r for _, r in sorted(self._replicas.items())]
            by_pool: dict[str | None, list[Replica]] = {None: ordered}
            for r in ordered:
                by_pool.setdefault(r.endpoint.pool, []).append(r)
            self._by_pool = by_pool
        return list(self._by_pool.get(pool, ()))

    def routable(self, pool: str) -> list[Replica]:
        """HEALTHY replicas of `pool`, in id order."""
        return [r for r in self.replicas(pool) if r.routable]

    def pools(self) -> list[str]:
        return sorted({r.endpoint.pool for r in self._replicas.values()})

    def __len__(self) -> int:
        return len(self._replicas)

    def __contains__(self, replica_id: object) -> bool:
        return replica_id in self._replicas

    # ---- observations ------------------------------------------------------------------------

    def _set_health(self, replica: Replica, healthy: bool, reason: str, now: float) -> None:
        if replica.healthy == healthy:
            return
        old = replica.state
        replica.healthy = healthy
        new = replica.state
        if old is not new:
            replica.state_since = now
            self._emit(ReplicaHealthChanged(replica, old, new, reason, now))

    def set_draining(self, replica_id: str, now: float, draining: bool = True) -> Replica:
        """Stop (or resume) routing new requests to a replica, whatever its health."""
        replica = self._require(replica_id)
        if replica.draining != draining:
            old = replica.state
            replica.draining = draining
            replica.state_since = now
            reason = "draining" if draining else "drain cancelled"
            self._emit(ReplicaHealthChanged(replica, old, replica.state, reason, now))
        return replica

    def admit(self, replica_id: str, now: float) -> Replica:
        """A PENDING replica joins routing (the actuator saw it ready)."""
        replica = self._require(replica_id)
        if replica.pending:
            old = replica.state
            replica.pending = False
            replica.state_since = now
            self._emit(ReplicaHealthChanged(replica, old, replica.state, "admitted", now))
        return replica

    def report_failure(
        self,
        replica_id: str,
        now: float,
        kind: FailureKind = FailureKind.CONNECTION,
        detail: str = "",
    ) -> bool:
        """A request to the replica failed; True when this failure ejected it.

        Unknown ids are ignored (the replica may have been removed while the request ran).
        """
        replica = self._replicas.get(replica_id)
        if replica is None:
            return False
        replica.consecutive_failures += 1
        replica.consecutive_probe_successes = 0
        replica.last_error = f"{kind.value}: {detail}" if detail else kind.value
        if replica.healthy and replica.consecutive_failures >= self.policy.threshold(kind):
            self._set_health(
                replica,
                False,
                f"{replica.consecutive_failures} consecutive request failure(s), last "
                f"{replica.last_error}",
                now,
            )
            return True
        return False

    def report_success(self, replica_id: str, now: float) -> None:
        """A request to the replica succeeded: its failure count starts again."""
        replica = self._replicas.get(replica_id)
        if replica is not None:
            replica.consecutive_failures = 0

    def observe_probe(
        self,
        replica_id: str,
        ok: bool,
        now: float,
        kind: FailureKind | None = None,
        detail: str = "",
    ) -> None:
        """One `/health` probe result (the health checker's input)."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return
        if ok:
            replica.consecutive_probe_failures = 0
            replica.consecutive_probe_successes += 1
            if (
                not replica.healthy
                and replica.consecutive_probe_successes >= self.policy.probe_successes_to_restore
            ):
                replica.consecutive_failures = 0
                replica.last_error = None
                self._set_health(replica, True, "health probe ok", now)
            return
        replica.consecutive_probe_successes = 0
        replica.consecutive_probe_failures += 1
        what = kind.value if kind is not None else "probe failed"
        replica.last_error = f"{what}: {detail}" if detail else what
        threshold = (
            self.policy.probe_timeouts_to_eject
            if kind is FailureKind.TIMEOUT
            else self.policy.probe_failures_to_eject
        )
        if replica.healthy and replica.consecutive_probe_failures >= max(1, threshold):
            self._set_health(
                replica,
                False,
                f"{replica.consecutive_probe_failures} failed health probe(s): "
                f"{replica.last_error}",
                now,
            )

    def observe_metrics(self, replica_id: str, metrics: ReplicaMetrics) -> None:
        """Store a scrape and fire `ReplicaMetricsUpdated` (the token-load reconciliation hook)."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return
        replica.metrics = metrics
        self._emit(ReplicaMetricsUpdated(replica, metrics, metrics.scraped_at))

    def _require(self, replica_id: str) -> Replica:
        replica = self._replicas.get(replica_id)
        if replica is None:
            raise KeyError(f"unknown replica {replica_id!r}")
        return replica
