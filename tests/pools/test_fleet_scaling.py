"""Fleet states an actuator uses: PENDING until admitted, DRAINING, move between pools."""

from __future__ import annotations

import pytest

from pools.drain import RequestTracker
from pools.fleet import Fleet, FleetEvent, ReplicaAdded, ReplicaRemoved
from pools.replica import ReplicaEndpoint, ReplicaState


def _endpoint(rid: str, pool: str, switchable: bool = True) -> ReplicaEndpoint:
    return ReplicaEndpoint(rid, pool, f"http://{rid}", "m", 16, switchable=switchable)


def test_pending_replica_is_not_routable_until_admitted() -> None:
    fleet = Fleet()
    fleet.add_replica(_endpoint("d-0", "decode"), 0.0, pending=True)
    pending = fleet.get("d-0")
    assert pending is not None and pending.state is ReplicaState.PENDING
    assert fleet.routable("decode") == []
    fleet.admit("d-0", 1.0)
    assert [r.replica_id for r in fleet.routable("decode")] == ["d-0"]


def test_move_replica_relabels_with_remove_then_add_events() -> None:
    fleet = Fleet()
    events: list[FleetEvent] = []
    fleet.add_replica(_endpoint("d-0", "decode"), 0.0)
    fleet.set_draining("d-0", 0.5)
    fleet.subscribe(events.append)
    moved = fleet.move_replica("d-0", "prefill", 1.0)
    assert moved.pool == "prefill" and moved.routable
    assert [type(e) for e in events] == [ReplicaRemoved, ReplicaAdded]
    assert fleet.replicas("decode") == [] and fleet.routable("prefill") == [moved]


def test_move_refuses_a_replica_that_is_not_switchable() -> None:
    fleet = Fleet()
    fleet.add_replica(_endpoint("d-0", "decode", switchable=False), 0.0)
    with pytest.raises(ValueError, match="switchable"):
        fleet.move_replica("d-0", "prefill", 1.0)


def test_request_tracker_counts_and_cuts_per_replica() -> None:
    tracker = RequestTracker()
    cut: list[str] = []
    tracker.begin("d-0", "r1", cut.append)
    tracker.begin("d-0", "r2")
    tracker.begin("p-0", "r1", cut.append)
    assert tracker.in_flight("d-0") == 2
    assert tracker.cut("d-0", "drained") == 1 and cut == ["drained"]
    tracker.end("d-0", "r1")
    tracker.end("d-0", "r2")
    assert tracker.in_flight("d-0") == 0 and tracker.in_flight("p-0") == 1
