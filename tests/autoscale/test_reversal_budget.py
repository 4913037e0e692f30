"""The reversal budget (`autoscale.reversal_budget`): the rule on hand-computed sequences, its
bound on random ones, the stabilizer's use of it, the policy schema and a simulator run."""

from __future__ import annotations

import random

import pytest

from autoscale.reversal_budget import REASON, ReversalBudget, budgets_of
from autoscale.signals import Pool
from autoscale.stabilization import PoolStabilizer, Windows
from benchmarks.autoscale_sim.flaps import worst_window_direction_changes
from tests.autoscale.obs import policy


def test_a_down_after_an_up_reversal_waits_a_whole_window_with_a_budget_of_two() -> None:
    b = ReversalBudget(count=2, window_s=600.0)
    b.observe(0.0, 1)
    b.observe(5.0, 2)  # the first up: no reversal (nothing before it)
    assert not b.refuses(100.0)  # no reversal in the last 600 s: a down may go
    b.observe(100.0, 2)
    b.observe(105.0, 1)  # that down, a reversal recorded when seen (105)
    assert not b.refuses(110.0)  # the last change was a down: a further down is no reversal
    b.observe(110.0, 1)
    b.observe(200.0, 2)  # up: a reversal (200); ups are never refused
    assert b.recent(300.0) == 2
    assert b.refuses(300.0)  # 2 in the window + this down + an up at once = 4 > 2
    b.observe(704.9, 2)
    assert b.recent(704.9) == 2 and b.refuses(704.9)  # 105 > 104.9: still inside
    b.observe(705.0, 2)
    assert b.recent(705.0) == 1 and b.refuses(705.0)  # 105 left (105 > 105 is false), 200 stays
    b.observe(800.0, 2)
    assert b.recent(800.0) == 0 and not b.refuses(800.0)  # 200 left at 800: room for 2


def test_a_budget_of_three_lets_one_reversal_stand_in_the_window() -> None:
    b = ReversalBudget(count=3, window_s=100.0)
    for t, n in ((0, 1), (5, 3), (10, 2), (15, 2), (20, 4)):  # up, down (rev 10), up (rev 20)
        b.observe(float(t), n)
    assert b.recent(25.0) == 2 and b.refuses(25.0)  # 2 + 1 + 1 = 4 > 3
    b.observe(110.0, 4)  # 10 left the window, 20 stays
    assert b.recent(110.0) == 1 and not b.refuses(110.0)  # 1 + 1 + 1 = 3


@pytest.mark.parametrize(("count", "window_s"), [(2, 600.0), (2, 60.0), (3, 120.0), (4, 300.0)])
def test_no_window_holds_more_than_count_whatever_the_ups_do(count: int, window_s: float) -> None:
    # a pool that asks at random (ups at once, downs through the rule) over many runs: the
    # flap measure's worst window never passes the budget, and every up asked for happened
    rng = random.Random(count * 1000 + int(window_s))
    for _ in range(200):
        b = ReversalBudget(count, window_s)
        n, events, refused = 4, [], 0
        for k in range(400):
            now = 5.0 * k
            b.observe(now, n)
            step = rng.choice((-2, -1, 0, 0, 1, 2))
            if step < 0 and b.refuses(now):
                refused += 1
                continue
            if step:
                events.append({"t_s": now, "pool": "prefill", "from": n, "to": n + step})
                n += step
        assert worst_window_direction_changes(events, "prefill", window_s) <= count
    assert refused > 0  # the rule did refuse downs (the case is not vacuous)


def test_without_the_rule_the_same_random_pool_passes_the_budget() -> None:
    rng = random.Random(2)
    n, events = 4, []
    for k in range(400):
        step = rng.choice((-2, -1, 0, 0, 1, 2))
        if step:
            events.append({"t_s": 5.0 * k, "pool": "prefill", "from": n, "to": n + step})
            n += step
    assert worst_window_direction_changes(events, "prefill", 600.0) > 2


def _stabilizer(budget: ReversalBudget | None) -> PoolStabilizer:
    return PoolStabilizer(Windows(0.0, 0.0, 0.0, 0.0, 0.0), budget=budget)


def _decide(s: PoolStabilizer, now: float, raw: int, current: int) -> tuple[int, str]:
    return s.decide(now, raw, raw, "need", current, 1e9, lambda start, cur: start)


def test_the_stabilizer_holds_a_reversing_down_and_lets_every_up_go() -> None:
    held = _stabilizer(ReversalBudget(2, 600.0))
    free = _stabilizer(None)
    # up 2 -> 4 (no reversal), down 4 -> 3 at 100 (room: none in the window), up 3 -> 5 at 200
    script = [(0.0, 4, 2), (100.0, 3, 4), (200.0, 5, 3)]
    for now, raw, current in script:
        assert _decide(held, now, raw, current) == _decide(free, now, raw, current)
    # a down at 300: the reversals at 100 (seen at 200) and 200 (seen now) fill the budget
    assert _decide(held, 300.0, 2, 5) == (5, REASON)
    assert _decide(free, 300.0, 2, 5) == (2, "need")
    assert _decide(held, 310.0, 7, 5) == (7, "need")  # an up goes at once
    assert _decide(held, 320.0, 2, 7) == (7, REASON)  # the next down is still a reversal
    # the up at 310 was no reversal (the pool never went down at 300); the up at 200, seen and
    # recorded at 300 (late, so it counts longer), leaves the window at 900
    assert _decide(held, 899.0, 2, 7) == (7, REASON)
    assert _decide(held, 900.0, 2, 7) == (2, "need")


def test_reversal_budget_is_off_by_default_and_checked_in_the_policy() -> None:
    assert policy().planner.reversal_budget is None  # off
    pl = policy(planner={"reversal_budget": {"prefill": {}}}).planner
    assert pl.reversal_budget is not None
    opt = pl.reversal_budget[Pool.PREFILL]
    assert (opt.count, opt.window_s) == (2, 600.0)  # the goal's 2 in 10 minutes
    both = policy(planner={"reversal_budget": {"prefill": {"count": 3}, "decode": {}}}).planner
    assert set(budgets_of(both.reversal_budget)) == {Pool.PREFILL, Pool.DECODE}
    assert budgets_of(both.reversal_budget)[Pool.PREFILL].count == 3
    bad: list[tuple[object, str]] = [
        ({"prefill": {"count": 1}}, "reversal_budget.prefill.count"),  # 1: downs wait for ever
        ({"prefill": {"count": 2.5}}, "reversal_budget.prefill.count"),
        ({"prefill": {"window_s": 0}}, "reversal_budget.prefill.window_s"),
        ({"prefill": {"windows_s": 600}}, "reversal_budget.prefill.windows_s"),
        ({"encode": {}}, "reversal_budget.encode"),
    ]
    for value, field in bad:
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            policy(planner={"reversal_budget": value})


def test_a_simulated_bursty_run_keeps_prefill_within_its_budget() -> None:
    # bursts of long prompts 40 s long every ~100 s, 10 s cold starts (the example policy with
    # short windows): prefill follows each burst down and back up; with a budget of 2 in any
    # 200 s the flap measure's worst window holds 2, and every request still meets the SLOs
    from benchmarks.autoscale_sim.runner import AutoscaleSimConfig, run_planner
    from tests.benchmarks.test_autoscale_sim import phases, small_policy

    wl = phases([(400, 10.0, 3000, 50), (60, 1.0, 3000, 50)] * 4)
    on = {"reversal_budget": {"prefill": {"count": 2, "window_s": 200.0}}}
    runs = {
        name: run_planner(
            wl, small_policy(), "pdorch", AutoscaleSimConfig(planner_options={"pdorch": opts})
        )
        for name, opts in (("off", {}), ("on", on))
    }
    assert worst_window_direction_changes(runs["off"]["events"], "prefill", 200.0) > 2
    assert worst_window_direction_changes(runs["on"]["events"], "prefill", 200.0) <= 2
    assert runs["on"]["attainment"]["both"] >= runs["off"]["attainment"]["both"]
    assert runs["on"]["lost"] == 0
    assert runs["on"]["gpu_hours"] >= runs["off"]["gpu_hours"]  # the holds are paid for
