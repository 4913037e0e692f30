"""Round 13: the floor's order on a ramp (`autoscale.ramp_edge`, planner option `ramp_epsilon`)
and the prefill pool's hold after a peak (`autoscale.prefill_release`, `prefill_floor_hold_s`)
(LinearPerfModel: decode 100 sequences per replica at the target; 1000 + 200 tokens)."""

from __future__ import annotations

import pytest

from autoscale.planner_terms import Term
from autoscale.prefill_release import PeakRelease
from autoscale.ramp_edge import ramp_term
from autoscale.signals import Pool
from autoscale.stabilization import PoolStabilizer, Windows
from tests.autoscale.obs import observation, policy
from tests.autoscale.test_planner import planner

D = Pool.DECODE


def test_ramp_term_raises_the_need_only_while_the_rate_ahead_is_above_the_level() -> None:
    term = Term(2, "itl-concurrency", {"need": 2.0})
    up = ramp_term(term, 30.0, 25.0, 0.1)
    assert up.replicas == 3 and up.inputs["need"] == pytest.approx(2.1)
    assert up.inputs["need_before_ramp_epsilon"] == 2.0 and up.reason == "itl-concurrency"
    assert ramp_term(term, 25.0, 25.0, 0.1) is term  # flat: no growth expected
    assert ramp_term(term, 20.0, 25.0, 0.1) is term  # falling
    assert ramp_term(term, 30.0, 25.0, 0.0) is term  # off
    # a need already past the integer is not moved a replica further
    assert ramp_term(Term(3, "x", {"need": 2.5}), 30.0, 25.0, 0.1).replicas == 3


def test_the_floor_ahead_orders_replica_k_once_a_growing_need_passes_k_minus_epsilon() -> None:
    # 7.72 rps, decode growth 2.5: the floor ahead is sized for 19.3 rps, need 19.3 * 10.1 / 100
    # = 1.949 -> 2 replicas; with epsilon 0.1 the need reads 2.049 -> 3 (the knife edge of the
    # 600 s day: 2.00 vs 2.01 ordered a tick apart)
    growth = {D: 2.5}
    plain = planner(cold_start_growth=growth).plan(observation(rate=7.72, p=(2, 0), d=(1, 0)))
    assert plain.desired[D] == 2
    assert plain.details["decode"]["floor_inputs"]["need"] == pytest.approx(1.9493, abs=1e-3)
    edge = planner(cold_start_growth=growth, ramp_epsilon=0.1).plan(
        observation(rate=7.72, p=(2, 0), d=(1, 0))
    )
    assert edge.desired[D] == 3 and edge.reasons[D] == "itl-concurrency"
    inputs = edge.details["decode"]["floor_inputs"]
    assert inputs["horizon_s"] == 120.0 and inputs["need"] == pytest.approx(2.0493, abs=1e-3)


def test_without_expected_growth_epsilon_changes_nothing() -> None:
    # a flat forecast and no growth: the floor ahead is the level's, so no epsilon (applied,
    # 0.5 would lift decode's need 0.909 to 1.409 -> 2)
    obs = observation(rate=9.0, p=(2, 0), d=(1, 0))
    on = planner(ramp_epsilon=0.5).plan(obs)
    assert on.desired == planner().plan(obs).desired and on.desired[D] == 1


def test_ramp_epsilon_is_checked_in_the_policy() -> None:
    assert policy().planner.ramp_epsilon == 0.0  # off: with the leg fit it flapped (Round 13)
    assert policy(planner={"ramp_epsilon": 0}).planner.ramp_epsilon == 0.0
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="ramp_epsilon"):
            policy(planner={"ramp_epsilon": bad})


def test_peak_release_shortens_the_hold_only_after_a_fall_from_the_window_peak() -> None:
    rel = PeakRelease(hold_s=60.0, window_s=180.0)
    assert rel.observe(0.0, 18.0) is None  # night: flat
    assert rel.observe(5.0, 16.0) is None  # noise within 25 % of the peak
    assert rel.observe(100.0, 96.0) is None  # the peak
    assert rel.observe(150.0, 73.0) is None  # 0.76 x the peak: still on it
    assert rel.observe(200.0, 72.0) == 60.0  # 0.75 x: after the peak
    # the peak leaves the window (> 180 s ago): the fall is measured from what remains
    assert rel.observe(290.0, 60.0) is None


def test_the_prefill_pool_holds_its_floors_shorter_after_a_peak() -> None:
    # a stabilizer with floors of 6 recorded at 0 s and 2 since; the fit count is 2
    windows = Windows(0.0, 180.0, 60.0, 180.0, 180.0)
    st = PoolStabilizer(windows)
    st.record_floor(0.0, (6, 6), (6, 6), None)
    for t in range(5, 130, 5):
        st.record_floor(float(t), (2, 2), (2, 2), None)
        st.decide(float(t), 2, 2, "ttft-throughput", 6, float(t), lambda start, cur: start)
    assert st._fast_down(125.0, 6, 125.0) == 6  # the 180 s hold keeps the floor of 6
    st.short_hold_s = 60.0
    assert st._fast_down(125.0, 6, 125.0) == 2


def test_prefill_floor_hold_s_is_checked_in_the_policy() -> None:
    assert policy().planner.prefill_floor_hold_s is None  # off: it flapped the whole Azure hour
    assert policy(planner={"prefill_floor_hold_s": None}).planner.prefill_floor_hold_s is None
    assert policy(planner={"prefill_floor_hold_s": 60}).planner.prefill_floor_hold_s == 60.0
    with pytest.raises(ValueError, match="prefill_floor_hold_s"):
        policy(planner={"prefill_floor_hold_s": -1})
