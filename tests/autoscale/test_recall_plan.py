"""The scale-up order shared by the actuators (`autoscale.actuators.recall.plan_scale_up`)."""

from __future__ import annotations

from autoscale.actuators.recall import DrainingReplica, ScaleUpPlan, plan_scale_up


def _d(
    rid: str, pool: str, work: float, since: float, left: float, movable: bool = True
) -> DrainingReplica:
    return DrainingReplica(rid, pool, work, since, left, movable)


def test_recall_takes_the_most_loaded_then_latest_draining_replica_of_the_pool() -> None:
    draining = [
        _d("d0", "decode", 3, 10.0, 30.0),
        _d("d1", "decode", 5, 5.0, 50.0),
        _d("d2", "decode", 5, 8.0, 50.0),  # as loaded as d1, drained later: first
        _d("p0", "prefill", 9, 9.0, 1.0),  # the other pool: never recalled
    ]
    plan = plan_scale_up("decode", 2, draining)
    assert plan == ScaleUpPlan(("d2", "d1"), (), 0)
    assert plan_scale_up("decode", 5, draining) == ScaleUpPlan(("d2", "d1", "d0"), (), 2)


def test_without_recall_every_replica_is_a_cold_start() -> None:
    draining = [_d("d0", "decode", 3, 10.0, 30.0)]
    assert plan_scale_up("decode", 2, draining, recall=False) == ScaleUpPlan((), (), 2)
    assert plan_scale_up("decode", 0, draining) == ScaleUpPlan((), (), 0)


def test_drain_moves_take_the_other_pools_replicas_that_land_before_a_cold_start() -> None:
    draining = [
        _d("p0", "prefill", 1, 0.0, 200.0),  # lands after a cold start: not moved
        _d("p1", "prefill", 1, 0.0, 40.0),
        _d("p2", "prefill", 1, 0.0, 10.0),  # soonest first
        _d("p3", "prefill", 1, 0.0, 1.0, movable=False),  # not role-agnostic
        _d("d0", "decode", 1, 0.0, 100.0),  # recalled first, whatever its remaining drain
    ]
    plan = plan_scale_up("decode", 4, draining, drain_moves=True, startup_s=120.0, switch_s=5.0)
    assert plan == ScaleUpPlan(("d0",), ("p2", "p1"), 1)
    # off (role switching off): only the recall
    assert plan_scale_up("decode", 4, draining, startup_s=120.0) == ScaleUpPlan(("d0",), (), 3)
    # a move must land strictly before the cold start: 115 + 5 is not before 120
    edge = [_d("p0", "prefill", 1, 0.0, 115.0)]
    plan = plan_scale_up("decode", 1, edge, drain_moves=True, startup_s=120.0, switch_s=5.0)
    assert plan == ScaleUpPlan((), (), 1)
