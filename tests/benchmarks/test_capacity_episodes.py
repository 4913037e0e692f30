"""Breach -> added capacity, as the what-if report measures it (`benchmarks/autoscale_sim/
result.py`): a breach is a planner tick with the observed p90 over target or the reactive term
binding; capacity is the next replica joining that pool (cold start ready, or a move landing)."""

from __future__ import annotations

from autoscale.decision import ScaleDecision
from autoscale.signals import Pool
from benchmarks.autoscale_sim.result import BreachTracker, role_move_landings, time_to_capacity
from benchmarks.fleet_sim.membership import MembershipEvent
from tests.autoscale.obs import latency, observation, policy

P, D = Pool.PREFILL, Pool.DECODE


def decision(now: float, **pools: dict[str, int]) -> ScaleDecision:
    return ScaleDecision(now, {P: 1, D: 1}, {}, details=dict(pools))


def test_breaches_by_p90_and_by_the_reactive_term_and_their_capacity() -> None:
    t = BreachTracker(policy())  # TTFT 2 s, ITL 50 ms
    calm = {"reactive": 1, "floor": 2}
    # 10 s: prefill p90 TTFT 3 s > 2 s (decode fine); 15 s: still (same episode)
    t.see(observation(10.0, ttft=latency(3.0)), decision(10.0, prefill=calm, decode=calm))
    t.see(observation(15.0, ttft=latency(3.0)), decision(15.0, prefill=calm, decode=calm))
    # 20 s: decode's reactive term asks 3 with floor 2 and 1 ready: binds -> a breach
    t.see(
        observation(20.0, d=(1, 0)),
        decision(20.0, prefill=calm, decode={"reactive": 3, "floor": 2}),
    )
    # 25 s: reactive 2 == floor 2: the floor binds, no breach
    t.see(observation(25.0), decision(25.0, prefill=calm, decode={"reactive": 2, "floor": 2}))
    # 200 s: prefill breaches again, nothing joins after it
    t.see(observation(200.0, ttft=latency(2.5)), decision(200.0, prefill=calm, decode=calm))
    assert t.breach == {
        "prefill": [(10.0, "p90"), (15.0, "p90"), (200.0, "p90")],
        "decode": [(20.0, "reactive")],
    }
    events = [
        MembershipEvent(0.0, "p0", "prefill", "ready"),  # the initial fleet: not capacity
        MembershipEvent(12.0, "d1", "prefill", "move"),  # asked for: not yet capacity
        MembershipEvent(19.0, "d1", "prefill", "moved"),  # landed 9 s after the 10 s breach
        MembershipEvent(130.0, "p2", "prefill", "ready"),
        MembershipEvent(140.0, "d2", "decode", "ready"),  # 120 s after decode's breach
    ]
    # the actuator's orders: the move into prefill at 12 s; decode's start at 20 s
    orders = [
        {"t_s": 12.0, "pool": "prefill", "from": 1, "to": 2, "kind": "move"},
        {"t_s": 12.0, "pool": "decode", "from": 2, "to": 1, "kind": "scale"},  # not up
        {"t_s": 20.0, "pool": "decode", "from": 1, "to": 2, "kind": "scale"},
    ]
    secs, episodes, unresolved = time_to_capacity(t, events, orders)
    assert secs == {"prefill": [9.0], "decode": [120.0]}
    assert episodes[0] == {
        "pool": "prefill",
        "breach_s": 10.0,
        "capacity_s": 19.0,
        "seconds": 9.0,
        "kind": "moved",
        "by": "p90",
        "ordered_s": 12.0,
    }
    assert episodes[1]["kind"] == "ready" and episodes[1]["by"] == "reactive"
    assert episodes[1]["ordered_s"] == 20.0
    assert unresolved == 1  # prefill at 200 s


def test_role_move_landings_pair_each_move_with_its_landing() -> None:
    events = [
        MembershipEvent(15.0, "d3", "prefill", "move"),  # asked: pending in prefill
        MembershipEvent(15.0, "d4", "prefill", "move"),
        MembershipEvent(21.5, "d3", "prefill", "moved"),  # drained + switch_s later
        MembershipEvent(285.0, "p1", "decode", "move"),
    ]
    rows = role_move_landings(events)
    assert rows[0] == {
        "replica": "d3",
        "from": "decode",
        "to": "prefill",
        "asked_s": 15.0,
        "ready_s": 21.5,
        "seconds": 6.5,
    }
    assert rows[1]["ready_s"] is None and rows[2]["from"] == "prefill"


def test_a_recalled_draining_replica_is_capacity_at_once() -> None:
    t = BreachTracker(policy())
    calm = {"reactive": 1, "floor": 2}
    t.see(observation(30.0, ttft=latency(3.0)), decision(30.0, prefill=calm, decode=calm))
    events = [
        MembershipEvent(28.0, "p1", "prefill", "drain"),
        MembershipEvent(30.0, "p1", "prefill", "recall"),
    ]
    orders = [{"t_s": 30.0, "pool": "prefill", "from": 1, "to": 2, "kind": "scale"}]
    secs, episodes, unresolved = time_to_capacity(t, events, orders)
    assert secs["prefill"] == [0.0] and unresolved == 0
    assert episodes[0]["kind"] == "recall" and episodes[0]["ordered_s"] == 30.0
