"""Scale-up takes back draining replicas first (`SimActuator.scale`): its own pool's by a
recall (serving at once), the other pool's by a move (its drain + `switch_s`), then cold
starts; and breach -> capacity over every episode (`benchmarks/autoscale_sim/capacity.py`)."""

from __future__ import annotations

from typing import Any

from autoscale.signals import Pool
from benchmarks.autoscale_sim.actuator import SimActuator
from benchmarks.autoscale_sim.capacity import capacity_distribution
from benchmarks.autoscale_sim.report import _markdown, summary_table
from benchmarks.autoscale_sim.report_plots import Plots
from benchmarks.fleet_sim import FleetSpec, SimConfig
from benchmarks.fleet_sim.membership import DynamicFleetSimulator
from tests.benchmarks.test_autoscale_sim import phases, small_policy

LONG = [(400, 8.0, 800, 600)]  # 600-token outputs: a decode drain lasts seconds


def _run(fleet: str, steps: dict[float, Any], **actuator: Any) -> tuple[Any, SimActuator]:
    """Run LONG on `fleet`; at each time in `steps` call it with (sim, actuator, now)."""
    wl = phases(LONG)
    holder: dict[str, SimActuator] = {}
    policy = small_policy(role_switching=True).model_copy()
    pools = {p: lim.model_copy(update={"startup_s": 120.0}) for p, lim in policy.pools.items()}
    policy = policy.model_copy(update={"pools": pools})

    def ctl(sim: DynamicFleetSimulator, now: float) -> None:
        if "a" not in holder:
            holder["a"] = SimActuator(sim, policy, **actuator)
        step = steps.get(now)
        if step is not None:
            step(sim, holder["a"], now)

    sim = DynamicFleetSimulator(
        wl, SimConfig(FleetSpec.parse(fleet)), controller=ctl, control_interval_s=0.5
    )
    res = sim.run_dynamic()
    assert res.lost == 0 and res.completed == res.arrived == wl.num_requests
    return res, holder["a"]


def test_a_scale_up_recalls_the_draining_replica_instead_of_a_cold_start() -> None:
    seen: dict[str, Any] = {}

    def drain(sim: DynamicFleetSimulator, a: SimActuator, now: float) -> None:
        a.scale(Pool.DECODE, 1, now)
        seen["drained"] = sim.status("decode")
        seen["busy"] = sim.by_id[sim.pool_members("decode", "draining")[0]].core.has_unfinished()

    def up(sim: DynamicFleetSimulator, a: SimActuator, now: float) -> None:
        a.scale(Pool.DECODE, 2, now)
        seen["recalled"] = sim.status("decode")

    res, act = _run("1P2D", {20.0: drain, 21.0: up})
    assert seen["drained"] == (1, 0, 1) and seen["busy"]  # still had work at the recall
    assert seen["recalled"] == (2, 0, 0)  # ready at once, nothing pending
    (recall,) = [e for e in res.events if e.kind == "recall"]
    assert recall.t_s == 21.0 and recall.pool == "decode"
    rid = recall.replica_id
    assert not [e for e in res.events if e.kind in ("removed", "add")]  # no leave, no start
    # out of routing while it drained, back in routing after: new requests reach it
    served = [r.arrival for r in res.sim.requests if r.decode_replica == rid]
    assert not [t for t in served if 20.0 < t < 21.0]
    assert [t for t in served if t > 21.0]
    assert act.recalls == {Pool.PREFILL: 0, Pool.DECODE: 1}


def test_without_recall_the_scale_up_is_a_cold_start() -> None:
    seen: dict[str, Any] = {}

    def drain(sim: DynamicFleetSimulator, a: SimActuator, now: float) -> None:
        a.scale(Pool.DECODE, 1, now)

    def up(sim: DynamicFleetSimulator, a: SimActuator, now: float) -> None:
        a.scale(Pool.DECODE, 2, now)
        seen["up"] = sim.status("decode")

    res, act = _run("1P2D", {20.0: drain, 21.0: up}, recall=False)
    assert seen["up"][:2] == (1, 1)  # a cold start pending, the draining one still leaving
    assert [e.kind for e in res.events if e.kind in ("recall", "add")] == ["add"]
    assert act.recalls[Pool.DECODE] == 0


def test_a_draining_replica_of_the_other_pool_moves_in_before_a_cold_start_would() -> None:
    seen: dict[str, Any] = {}

    def drain(sim: DynamicFleetSimulator, a: SimActuator, now: float) -> None:
        a.scale(Pool.DECODE, 1, now)
        seen["rid"] = sim.pool_members("decode", "draining")[0]

    def up(sim: DynamicFleetSimulator, a: SimActuator, now: float) -> None:
        a.scale(Pool.PREFILL, 2, now)
        seen["prefill"] = sim.status("prefill")

    res, act = _run("1P2D", {20.0: drain, 21.0: up})
    assert seen["prefill"] == (1, 1, 0)  # pending in prefill: the draining decode replica
    rid = seen["rid"]
    moved = next(e for e in res.events if e.kind == "moved")
    assert moved.replica_id == rid and moved.pool == "prefill"
    assert 21.0 + 5.0 <= moved.t_s < 21.0 + 120.0  # its drain + switch_s, before a cold start
    assert not [e for e in res.events if e.kind == "add"]
    as_prefill = [r for r in res.sim.requests if r.prefill_replica == rid]
    assert as_prefill and all(r.arrival >= moved.t_s for r in as_prefill)
    assert act.drain_move_count == {Pool.PREFILL: 1, Pool.DECODE: 0}


def test_draining_moves_need_role_switching_and_can_be_turned_off() -> None:
    def drain(sim: DynamicFleetSimulator, a: SimActuator, now: float) -> None:
        a.scale(Pool.DECODE, 1, now)

    def up(sim: DynamicFleetSimulator, a: SimActuator, now: float) -> None:
        a.scale(Pool.PREFILL, 2, now)

    for options in ({"drain_moves": False}, {"role_switching": False}):
        res, act = _run("1P2D", {20.0: drain, 21.0: up}, **options)
        assert act.drain_move_count[Pool.PREFILL] == 0
        assert [e.pool for e in res.events if e.kind == "add"] == ["prefill"]


def _episode(pool: str, breach: float, secs: float, kind: str, ordered: float | None) -> Any:
    return {
        "pool": pool,
        "breach_s": breach,
        "capacity_s": breach + secs,
        "seconds": secs,
        "kind": kind,
        "by": "p90",
        "ordered_s": ordered,
    }


def test_capacity_distribution_over_every_episode_by_kind() -> None:
    eps = [
        _episode("prefill", 10.0, 120.0, "ready", 10.0),
        _episode("prefill", 200.0, 6.0, "moved", 200.0),
        _episode("prefill", 300.0, 0.0, "recall", 300.0),
        _episode("prefill", 500.0, 140.0, "ready", 520.0),
        _episode("decode", 50.0, 30.0, "ready", None),  # ordered before the breach
    ]
    d = capacity_distribution(eps)
    p = d["prefill"]
    assert p["all"]["count"] == 4
    assert p["all"]["median_s"] == 63.0  # (6 + 120) / 2
    assert abs(p["all"]["p90_s"] - 134.0) < 1e-9  # 120 + 0.7 * 20
    assert p["all"]["max_s"] == 140.0 and p["all"]["share_within_goal"] == 0.5
    assert p["by_kind"]["cold_start"]["count"] == 2
    assert p["by_kind"]["cold_start"]["share_within_goal"] == 0.0
    assert p["by_kind"]["move"]["median_s"] == 6.0
    assert p["by_kind"]["recall"]["share_within_goal"] == 1.0
    assert p["breach_to_order"]["count"] == 4 and p["breach_to_order"]["max_s"] == 20.0
    assert d["decode"]["breach_to_order"]["count"] == 0
    assert d["decode"]["by_kind"]["move"]["median_s"] is None


def test_report_prints_the_distribution_and_the_recalls() -> None:
    eps = [_episode("prefill", 10.0, 0.0, "recall", 10.0)]
    run = {
        "command": "x",
        "planners": {
            "pdorch": {
                "attainment": {"both": 1.0, "ttft": 1.0, "itl": 1.0},
                "gpu_hours": 1.0,
                "lost": 0,
                "requests": 1,
                "capacity_episodes": eps,
                "recalls": {"prefill": 1, "decode": 0},
                "drain_moves": {"prefill": 0, "decode": 2},
            }
        },
    }
    text = _markdown(run, summary_table(run), Plots())
    assert "| `pdorch` | prefill | recall | 1 | 0.0 | 0.0 | 0.0 | 100.00 |" in text
    assert "| `pdorch` | 1 | 0 | 0 | 2 |" in text
