"""`planner.cold_start_spare`: an additive spare on the floor ahead and in pdorch's start fleet
(`autoscale/predictive_floor.py`), against hand-computed counts (LinearPerfModel: decode
100 sequences per replica at the 50 ms target, own prefill 0.1 s for 1000 tokens)."""

from __future__ import annotations

import pytest

from autoscale.load_window import LoadWindow
from autoscale.planner import PdorchPlanner
from autoscale.signals import Pool
from tests.autoscale.obs import observation, policy
from tests.autoscale.test_planner import planner

P, D = Pool.PREFILL, Pool.DECODE


def test_spare_adds_replicas_to_the_floor_ahead_not_a_multiple_of_the_rate() -> None:
    # 9 rps, 1000 + 200 tokens: decode 9 * (0.1 + 200 * 0.05) = 90.9 sequences / 100 = 0.909
    # -> 1 now; one spare: 1.909 -> 2 (growth 2.5 asked 3: `test_projections.py`)
    d = planner(cold_start_spare={"decode": 1.0}).plan(observation(rate=9.0, p=(2, 0), d=(1, 0)))
    assert d.desired[D] == 2
    inputs = d.details["decode"]["floor_inputs"]
    assert inputs["horizon_s"] == 120.0 and inputs["need"] == pytest.approx(1.909)
    assert d.desired[P] == 2  # prefill (9k tok/s over 8k) has no spare: its level's 2


def test_spare_on_a_big_pool_stays_one_replica_where_growth_scales_with_it() -> None:
    # 45 rps: decode 45 * 10.1 = 454.5 / 100 = 4.545 -> 5 now; one spare: 5.545 -> 6;
    # growth 2.5 sizes 112.5 rps: 11.36 -> 12
    obs = observation(rate=45.0, p=(6, 0), d=(5, 0))
    spare = planner(cold_start_spare={"decode": 1.0}).plan(obs)
    grown = planner(cold_start_growth={"decode": 2.5}).plan(obs)
    assert spare.desired[D] == 6
    assert grown.desired[D] == 12


def test_spare_is_a_minimum_a_larger_forecast_ahead_still_wins() -> None:
    # spare 0.5 on 0.909 now is 1.409 -> 2; growth 2.5 ahead (2.27 -> 3) is larger and wins
    pl = planner(cold_start_spare={"decode": 0.5}, cold_start_growth={"decode": 2.5})
    d = pl.plan(observation(rate=9.0, p=(2, 0), d=(1, 0)))
    assert d.desired[D] == 3
    assert "spare" not in d.details["decode"]["floor_inputs"]


def test_start_fleet_holds_the_spare_at_the_first_windows_load() -> None:
    window = LoadWindow(0.0, 30.0, 9.0, 1000.0, 200.0, 0.0)
    # decode ceil(0.909 + 1) = 2; prefill (no spare) as the harness gave it
    spare = planner(cold_start_spare={"decode": 1.0})
    assert spare.start_fleet(window, {P: 1, D: 1}) == {P: 1, D: 2}
    # never below the harness's fleet, never above the pool's max
    assert spare.start_fleet(window, {P: 1, D: 4}) == {P: 1, D: 4}
    capped = planner(policy(dmax=3), cold_start_spare={"decode": 5.0})
    assert capped.start_fleet(window, {P: 1, D: 1}) == {P: 1, D: 3}
    # without a spare the fleet is unchanged (main's start)
    assert planner().start_fleet(window, {P: 1, D: 1}) == {P: 1, D: 1}


def test_cold_start_spare_is_checked_in_the_policy() -> None:
    assert policy().planner.cold_start_spare is None
    on = policy(planner={"cold_start_spare": {"decode": 1.0}})
    assert on.planner.cold_start_spare == {D: 1.0}
    with pytest.raises(ValueError, match="cold_start_spare"):
        policy(planner={"cold_start_spare": {"decode": -1.0}})
    with pytest.raises(ValueError, match="cold_start_spare"):
        policy(planner={"cold_start_spare": {"gpu": 1.0}})


def test_spare_until_s_stands_before_it_only() -> None:
    # the first test's 9 rps: one spare asks 2 decode before 300 s, the plain 1 from 300 s on
    def pl() -> PdorchPlanner:
        return planner(cold_start_spare={"decode": 1.0}, cold_start_spare_until_s=300.0)

    before = pl().plan(observation(rate=9.0, p=(2, 0), d=(1, 0), now=295.0))
    after = pl().plan(observation(rate=9.0, p=(2, 0), d=(1, 0), now=300.0))
    assert before.desired[D] == 2
    assert after.desired[D] == 1
    assert "spare" not in after.details["decode"]["floor_inputs"]
    with pytest.raises(ValueError, match="cold_start_spare_until_s"):
        policy(planner={"cold_start_spare_until_s": -1.0})
