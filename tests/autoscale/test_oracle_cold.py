"""`oracle-cold` (autoscale/baselines/oracle_cold.py) against hand-computed plans.

The grid is the oracle's 30 s: interval k is [30k, 30k + 30); startup_s = S = 120 s.
"""

from __future__ import annotations

import math
import random

from autoscale.baselines.oracle import OraclePlanner
from autoscale.baselines.oracle_cold import OracleColdPlanner, cold_count, grid_span
from autoscale.planners import planner_factory, planner_names
from autoscale.policy import load_policy
from autoscale.signals import Pool
from benchmarks.autoscale_sim.runner import run_planner, trace_requests
from benchmarks.workloads.model import Segment, SessionSpec, TurnSpec, Workload
from tests.autoscale.obs import observation, policy
from tests.autoscale.perf_double import LinearPerfModel
from tests.data import REPO

P, D = Pool.PREFILL, Pool.DECODE
PERF = LinearPerfModel()


def needs(prefill: list[int], decode: int = 1) -> list[dict[Pool, int]]:
    return [{P: n, D: decode} for n in prefill]


def test_grid_span_includes_the_interval_an_order_lands_in() -> None:
    assert list(grid_span(60.0, 180.0, 30.0)) == [2, 3, 4, 5, 6]  # 180 s opens interval 6
    assert list(grid_span(55.0, 175.0, 30.0)) == [1, 2, 3, 4, 5]
    assert list(grid_span(29.9999999, 149.9999999, 30.0)) == [1, 2, 3, 4, 5]  # float ticks


def test_a_step_up_is_ordered_exactly_startup_s_ahead() -> None:
    # prefill needs 1 until 180 s, then 3: the order goes at 180 - 120 = 60 s, not at 55 s
    pl = OracleColdPlanner(policy(), PERF, needs=needs([1] * 6 + [3] * 4))
    assert pl.interval_s == 5.0  # the policy's reactive_s: pdorch's tick
    assert pl.plan(observation(55.0, p=(1, 0))).desired[P] == 1
    d = pl.plan(observation(60.0, p=(1, 0)))
    assert d.desired[P] == 3 and d.reasons[P] == "oracle-cold-ahead"
    # the two pending replicas count: no second order while they start
    assert pl.plan(observation(65.0, p=(1, 2))).desired[P] == 3
    # decode needs 1 all along: nothing ordered, nothing released
    assert d.desired[D] == 1


def test_a_dip_no_longer_than_startup_s_is_kept() -> None:
    # 3 until 120 s, 1 for [120, 240), 3 again from 240 s: released at 120 s the replicas
    # would have to be re-ordered at 240 - 120 = 120 s, so they are kept through the dip
    pl = OracleColdPlanner(policy(), PERF, needs=needs([3] * 4 + [1] * 4 + [3] * 4))
    for t in (120.0, 150.0, 200.0, 235.0):
        assert pl.plan(observation(t, p=(3, 0))).desired[P] == 3, t


def test_a_dip_longer_than_startup_plus_drain_is_released_and_reordered_in_time() -> None:
    # 3 until 120 s, 1 for [120, 300), 3 from 300 s (a 180 s dip > S + d = 125 s):
    # released at the dip's start, re-ordered at 300 - 120 = 180 s
    pl = OracleColdPlanner(policy(), PERF, needs=needs([3] * 4 + [1] * 6 + [3] * 4))
    d = pl.plan(observation(120.0, p=(3, 0)))
    assert d.desired[P] == 1 and d.reasons[P] == "oracle-cold-ahead"
    assert pl.plan(observation(175.0, p=(1, 0))).desired[P] == 1
    assert pl.plan(observation(180.0, p=(1, 0))).desired[P] == 3


def test_the_break_even_counts_the_drain() -> None:
    # a 150 s dip [120, 270): released with d = 5 s (150 > 125: restart + drain is cheaper),
    # kept with d = 40 s (150 <= 160); a 180 s dip is released with d = 40 s too
    dip150 = needs([3] * 4 + [1] * 5 + [3] * 4)
    dip180 = needs([3] * 4 + [1] * 6 + [3] * 4)
    short = OracleColdPlanner(policy(), PERF, needs=dip150)
    assert short.plan(observation(120.0, p=(3, 0))).desired[P] == 1
    kept = OracleColdPlanner(policy(), PERF, needs=dip150, drain_s=40.0)
    d = kept.plan(observation(120.0, p=(3, 0)))
    assert d.desired[P] == 3 and d.reasons[P] == "oracle-cold-keep"
    # ... but a kept count is never grown early: from 1 provisioned it orders at 150 s only
    assert kept.plan(observation(120.0, p=(1, 0))).desired[P] == 1
    assert kept.plan(observation(150.0, p=(1, 0))).desired[P] == 3
    released = OracleColdPlanner(policy(), PERF, needs=dip180, drain_s=40.0)
    assert released.plan(observation(120.0, p=(3, 0))).desired[P] == 1
    # the pure rule, per pool: (desired, U, K)
    need = [3, 3, 3, 3, 1, 1, 1, 1, 1, 3].__getitem__
    rule = {"grid_s": 30.0, "startup_s": 120.0, "drain_s": 40.0, "tick_s": 5.0}
    assert cold_count(need, 120.0, 3, **rule) == (3, 1, 3)


def test_no_order_for_a_need_it_cannot_reach_in_time() -> None:
    # the opening: decode needs 5 in [60, 90) and 4 from 90 s, 5 again from 240 s. At the
    # first tick (5 s) an order lands at 125 s: it is sized for 4 (the need there), not for
    # the 5 of [60, 90) it cannot reach (it would be paid pending, then cancelled at 90 s)
    decode = [2, 2, 5, 4, 4, 4, 4, 4, 5, 5]
    pl = OracleColdPlanner(policy(), PERF, needs=[{P: 1, D: n} for n in decode])
    assert pl.plan(observation(5.0, d=(2, 0))).desired[D] == 4
    assert pl.plan(observation(90.0, d=(2, 2))).desired[D] == 4  # no cancel
    assert pl.plan(observation(120.0, d=(4, 0))).desired[D] == 5  # for 240 s


def test_needs_are_clamped_and_kept_within_the_budget() -> None:
    # needs past the given list are the pools' min (1); max 4 clamps a need of 9
    pl = OracleColdPlanner(policy(pmax=4), PERF, needs=needs([9, 9]))
    assert pl.need(0) == {P: 4, D: 1} and pl.need(7) == {P: 1, D: 1}
    # budget 6: prefill keeps 4 for a later need (d = 40 s), decode orders 3 for 240 s:
    # 7 GPUs asked, the budget split gives 6
    many = [{P: 4, D: 1}] * 4 + [{P: 1, D: 3}] * 5 + [{P: 4, D: 3}] * 4
    capped = OracleColdPlanner(policy(budget=6), PERF, needs=many, drain_s=40.0)
    d = capped.plan(observation(120.0, p=(4, 0), d=(1, 0)))
    assert sum(d.desired.values()) == 6 and "budget" in d.reasons.values()
    free = OracleColdPlanner(policy(), PERF, needs=many, drain_s=40.0)
    assert free.plan(observation(120.0, p=(4, 0), d=(1, 0))).desired == {P: 4, D: 3}


def test_needs_from_the_trace_are_the_oracles() -> None:
    # 16 rps of 1000-token prompts (0.1 s each) on [0, 300), 32 rps more on [180, 300):
    # prefill replays to 2 servers (one every 0.125 s each) before 180 s and 5 after
    # (48 rps: 4 servers get one every 0.083 s and queue 6 s by the interval's end)
    trace = [(i / 16.0, 1000, 100, 0.0) for i in range(16 * 300)]
    trace += [(180.0 + i / 32.0, 1000, 100, 0.0) for i in range(32 * 120)]
    trace.sort()
    cold = OracleColdPlanner(policy(), PERF, requests=trace)
    oracle = OraclePlanner(policy(), PERF, requests=trace)
    assert [cold.need(k)[P] for k in (4, 5, 6, 9, 10)] == [2, 2, 5, 5, 1]
    assert cold.need(6)[D] == oracle.need(180.0, 210.0)[D]
    assert cold.plan(observation(55.0, p=(2, 0))).desired[P] == 2
    assert cold.plan(observation(60.0, p=(2, 0))).desired[P] == 5
    # registered, and handed the trace by the what-if runner like the oracle
    assert "oracle-cold" in planner_names()
    built = planner_factory("oracle-cold")(policy(), PERF, requests=trace)
    assert built.plan(observation(60.0, p=(2, 0))).desired[P] == 5


def burst_workload() -> Workload:
    """Open-loop single-turn requests: 3 rps of 1k-token prompts for ~75 s, 12 rps of 4k-token
    prompts for ~30 s, 3 rps again for ~30 s."""
    rng = random.Random(0)
    sessions, t = [], 0.0
    for k, (n, rate, isl) in enumerate([(225, 3.0, 1000), (360, 12.0, 4000), (90, 3.0, 1000)]):
        for i in range(n):
            t += rng.expovariate(rate)
            prompt = [Segment(rng.getrandbits(60), isl)]
            turns = [TurnSpec(prompt, 100)]
            sessions.append(SessionSpec(f"r{k}-{i}", t, turns, carry_context=False))
    return Workload("burst", sessions)


def test_in_the_simulator_it_pays_the_cold_start_the_oracle_does_not() -> None:
    # the example policy with startup_s 30 s: oracle-cold orders the burst's prefill 30 s
    # before the burst's first interval, its replicas are pending meanwhile (paid), the
    # oracle's start at once; nothing is lost
    base = load_policy(REPO / "deploy" / "examples" / "slo-policy.yaml")
    pools = {p: lim.model_copy(update={"startup_s": 30.0}) for p, lim in base.pools.items()}
    pol = base.model_copy(update={"pools": pools})
    wl = burst_workload()
    requests = trace_requests(wl, 64)
    out = {n: run_planner(wl, pol, n, requests=requests) for n in ("oracle", "oracle-cold")}
    for name, r in out.items():
        assert r["lost"] == 0 and r["completed"] == wl.num_requests, name
    cold = out["oracle-cold"]
    burst_at = requests[225][0]  # the first 4k-token prompt
    opens = 30.0 * math.floor(burst_at / 30.0)  # the grid interval it opens
    ups = [e for e in cold["events"] if e["pool"] == "prefill" and e["to"] > e["from"]]
    assert ups and ups[0]["t_s"] == opens - 30.0 and ups[0]["reason"] == "oracle-cold-ahead"
    assert any(row["prefill"]["pending"] > 0 for row in cold["timeline"])
    assert all(row["prefill"]["pending"] == 0 for row in out["oracle"]["timeline"])
    # the same plan otherwise: the difference is one replica pending for 30 s
    assert abs(cold["gpu_hours"] - out["oracle"]["gpu_hours"] - 30.0 / 3600.0) < 1e-3
