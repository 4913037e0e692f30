"""Fleet state: membership at run time, listeners, ejection and recovery rules (pure)."""

from __future__ import annotations

import pytest

from pools.fleet import (
    FailureKind,
    Fleet,
    FleetEvent,
    HealthPolicy,
    ReplicaAdded,
    ReplicaHealthChanged,
    ReplicaMetricsUpdated,
    ReplicaRemoved,
)
from pools.replica import ReplicaEndpoint, ReplicaMetrics, ReplicaState


def endpoint(replica_id: str, pool: str = "decode") -> ReplicaEndpoint:
    return ReplicaEndpoint(
        replica_id=replica_id,
        pool=pool,
        url=f"http://127.0.0.1:1/{replica_id}",
        model="m",
        block_size=16,
        kv_events_endpoint=f"ipc:///tmp/{replica_id}",
        kv_events_topic=replica_id,
    )


def state_of(fleet: Fleet, replica_id: str) -> ReplicaState:
    """The replica's state, read fresh (a call, so mypy does not keep an earlier narrowing)."""
    replica = fleet.get(replica_id)
    assert replica is not None
    return replica.state


def recorded(fleet: Fleet) -> list[FleetEvent]:
    events: list[FleetEvent] = []
    fleet.subscribe(events.append)
    return events


def test_add_and_remove_at_run_time_fire_listeners() -> None:
    fleet = Fleet()
    events = recorded(fleet)
    fleet.add_replica(endpoint("decode-0"), now=1.0)
    fleet.add_replica(endpoint("prefill-0", "prefill"), now=2.0)
    assert [type(e) for e in events] == [ReplicaAdded, ReplicaAdded]
    assert events[0].replica.endpoint.kv_events_endpoint == "ipc:///tmp/decode-0"
    assert [r.replica_id for r in fleet.routable("decode")] == ["decode-0"]
    assert fleet.pools() == ["decode", "prefill"]
    removed = fleet.remove_replica("decode-0", now=3.0)
    assert isinstance(events[-1], ReplicaRemoved) and events[-1].now == 3.0
    assert removed.replica_id == "decode-0" and "decode-0" not in fleet
    assert fleet.routable("decode") == [] and len(fleet) == 1


def test_duplicate_and_unknown_ids() -> None:
    fleet = Fleet()
    fleet.add_replica(endpoint("d"), 0.0)
    with pytest.raises(KeyError):
        fleet.add_replica(endpoint("d"), 0.0)
    with pytest.raises(KeyError):
        fleet.remove_replica("nope", 0.0)
    # request-path reports about a replica removed meanwhile are ignored
    assert fleet.report_failure("nope", 0.0) is False


def test_connection_failure_ejects_at_once_and_probe_restores() -> None:
    fleet = Fleet()
    events = recorded(fleet)
    fleet.add_replica(endpoint("d"), 0.0)
    assert fleet.report_failure("d", 1.0, FailureKind.CONNECTION, "refused") is True
    replica = fleet.get("d")
    assert replica is not None and replica.state is ReplicaState.UNHEALTHY
    assert fleet.routable("decode") == []
    change = events[-1]
    assert isinstance(change, ReplicaHealthChanged)
    assert (change.old, change.new) == (ReplicaState.HEALTHY, ReplicaState.UNHEALTHY)
    assert "refused" in change.reason
    fleet.report_success("d", 1.5)  # a late success does not bring it back
    assert replica.state is ReplicaState.UNHEALTHY
    fleet.observe_probe("d", True, 2.0)
    assert state_of(fleet, "d") is ReplicaState.HEALTHY and replica.state_since == 2.0
    assert isinstance(events[-1], ReplicaHealthChanged) and events[-1].new is ReplicaState.HEALTHY


def test_5xx_and_timeouts_need_consecutive_failures() -> None:
    fleet = Fleet(HealthPolicy(http_failures_to_eject=3, timeout_failures_to_eject=2))
    fleet.add_replica(endpoint("d"), 0.0)
    assert not fleet.report_failure("d", 1.0, FailureKind.HTTP_5XX)
    assert not fleet.report_failure("d", 1.1, FailureKind.HTTP_5XX)
    fleet.report_success("d", 1.2)  # resets the count
    assert not fleet.report_failure("d", 1.3, FailureKind.HTTP_5XX)
    assert not fleet.report_failure("d", 1.4, FailureKind.HTTP_5XX)
    assert fleet.report_failure("d", 1.5, FailureKind.HTTP_5XX)
    fleet.observe_probe("d", True, 2.0)
    assert not fleet.report_failure("d", 3.0, FailureKind.TIMEOUT)
    assert fleet.report_failure("d", 3.1, FailureKind.TIMEOUT)


def test_probe_thresholds() -> None:
    fleet = Fleet(HealthPolicy(probe_failures_to_eject=2, probe_successes_to_restore=2))
    fleet.add_replica(endpoint("d"), 0.0)
    replica = fleet.get("d")
    assert replica is not None
    fleet.observe_probe("d", False, 1.0, FailureKind.TIMEOUT)
    assert replica.routable
    fleet.observe_probe("d", False, 1.25, FailureKind.TIMEOUT)
    assert replica.state is ReplicaState.UNHEALTHY and replica.last_error == "timeout"
    fleet.observe_probe("d", True, 1.5)
    assert not replica.routable
    fleet.observe_probe("d", True, 1.75)
    assert replica.routable


def test_one_late_probe_does_not_eject_but_a_refused_one_does() -> None:
    fleet = Fleet()  # the defaults: a timeout ejects on the 2nd in a row, a refusal at once
    for replica_id in ("late", "dead"):
        fleet.add_replica(endpoint(replica_id), 0.0)
    late, dead = fleet.get("late"), fleet.get("dead")
    assert late is not None and dead is not None
    fleet.observe_probe("late", False, 1.0, FailureKind.TIMEOUT)
    assert late.routable  # one late probe on a busy host
    fleet.observe_probe("late", True, 1.25)
    fleet.observe_probe("late", False, 1.5, FailureKind.TIMEOUT)
    assert late.routable  # the success in between reset the count
    fleet.observe_probe("late", False, 1.75, FailureKind.TIMEOUT)
    assert late.state is ReplicaState.UNHEALTHY  # two in a row: hung
    fleet.observe_probe("dead", False, 1.0, FailureKind.CONNECTION)
    assert dead.state is ReplicaState.UNHEALTHY


def test_draining_is_kept_whatever_health_says() -> None:
    fleet = Fleet()
    events = recorded(fleet)
    fleet.add_replica(endpoint("d"), 0.0)
    fleet.set_draining("d", 1.0)
    replica = fleet.get("d")
    assert replica is not None and replica.state is ReplicaState.DRAINING
    assert isinstance(events[-1], ReplicaHealthChanged) and events[-1].new is ReplicaState.DRAINING
    fleet.observe_probe("d", True, 2.0)
    assert replica.state is ReplicaState.DRAINING and fleet.routable("decode") == []
    fleet.report_failure("d", 3.0)  # health still tracked underneath
    fleet.set_draining("d", 4.0, draining=False)
    assert state_of(fleet, "d") is ReplicaState.UNHEALTHY
    fleet.observe_probe("d", True, 5.0)
    assert replica.routable


def test_metrics_are_stored_and_announced() -> None:
    fleet = Fleet()
    events = recorded(fleet)
    fleet.add_replica(endpoint("d"), 0.0)
    metrics = ReplicaMetrics(3, 1, 0.5, 100.0, 25.0, 1000, 16, scraped_at=7.0)
    fleet.observe_metrics("d", metrics)
    assert isinstance(events[-1], ReplicaMetricsUpdated)
    assert events[-1].now == 7.0 and events[-1].metrics.prefix_hit_rate == 0.25
    replica = fleet.get("d")
    assert replica is not None and replica.metrics is metrics


def test_a_failing_listener_does_not_stop_the_others() -> None:
    fleet = Fleet()

    def broken(event: FleetEvent) -> None:
        raise RuntimeError("listener bug")

    fleet.subscribe(broken)
    events = recorded(fleet)
    fleet.add_replica(endpoint("d"), 0.0)
    assert len(events) == 1


def test_unsubscribe() -> None:
    fleet = Fleet()
    events: list[FleetEvent] = []
    unsubscribe = fleet.subscribe(events.append)
    fleet.add_replica(endpoint("a"), 0.0)
    unsubscribe()
    fleet.add_replica(endpoint("b"), 0.0)
    assert len(events) == 1
