"""Late binding in the fleet simulator (`NAME+late`, router/late_binding.py): held arrivals are
admitted when a replica's queued prefill drops, shortest first; fast-forward stays exact."""

from __future__ import annotations

import pytest

from benchmarks.fleet_sim import FleetSpec, SimConfig
from benchmarks.fleet_sim.metrics import check_conservation, compute_metrics
from benchmarks.fleet_sim.simulator import FleetSimulator, SimResult
from benchmarks.workloads.model import Segment, SessionSpec, TurnSpec, Workload


def burst() -> Workload:
    """Two long prompts (0.9 s of prefill each on an H100), then a short one, almost at once;
    later a few more mixed ones."""
    sizes = [(0.0, 30_000), (0.01, 30_000), (0.02, 500)]
    sizes += [(1.5 + 0.05 * i, 12_000 if i % 2 else 700) for i in range(10)]
    sessions = [
        SessionSpec(f"s{i}", t, [TurnSpec([Segment(100 + i, n)], output_tokens=20)])
        for i, (t, n) in enumerate(sizes)
    ]
    return Workload("burst", sessions)


def run(fleet: str, policy: str, fast_forward: bool = True) -> tuple[FleetSimulator, SimResult]:
    sim = FleetSimulator(
        burst(), SimConfig(FleetSpec.parse(fleet), policy=policy, fast_forward=fast_forward)
    )
    return sim, sim.run()


def ttft(result: SimResult, session: str) -> float:
    (rec,) = [r for r in result.requests if r.request_id == f"{session}#0"]
    assert rec.first_token is not None
    return rec.first_token - rec.arrival


def test_a_short_prompt_held_behind_a_busy_replica_goes_before_an_earlier_long_one() -> None:
    _, off = run("1C", "token_load")
    sim, late = run("1C", "token_load+late")
    assert sim.binding is not None and sim.binding.max_held >= 2 and sim.binding.delayed >= 2
    assert not check_conservation(late)
    assert compute_metrics(late, 2000.0, 100.0)["late_binding_delayed"] == sim.binding.delayed
    assert "late_binding_delayed" not in compute_metrics(off, 2000.0, 100.0)
    # off: the engine prefills s1 (30k) and s2 (500) side by side in arrival order, so s2's
    # first token comes with s1's; late: both wait for s0's prefill, then s2 is bound first
    assert ttft(off, "s2") > ttft(off, "s1") - 0.05
    assert ttft(late, "s2") < 0.7 * ttft(off, "s2")
    assert ttft(late, "s0") <= ttft(off, "s0")  # nothing was held before it (nor beside it)


@pytest.mark.parametrize("fleet", ["2C", "1P1D"])
def test_fast_forward_is_exact_with_late_binding(fleet: str) -> None:
    sim, fast = run(fleet, "token_load+late:hold_queued_s=0.2", fast_forward=True)
    _, slow = run(fleet, "token_load+late:hold_queued_s=0.2", fast_forward=False)
    assert sim.binding is not None and sim.binding.delayed >= 1
    assert fast.num_fast_forward_steps > 0
    assert fast.requests == slow.requests
    assert sorted(fast.itl_samples) == sorted(slow.itl_samples)
    assert fast.num_steps == slow.num_steps
