"""The floor's order on a ramp (`autoscale.ramp_edge`, planner option `ramp_epsilon`, Round 13)
(LinearPerfModel: decode 100 sequences per replica at the target; 1000 + 200 tokens)."""

from __future__ import annotations

import pytest

from autoscale.planner_terms import Term
from autoscale.ramp_edge import ramp_term
from autoscale.signals import Pool
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
    assert policy().planner.ramp_epsilon == 0.0
    assert policy(planner={"ramp_epsilon": 0.1}).planner.ramp_epsilon == 0.1
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="ramp_epsilon"):
            policy(planner={"ramp_epsilon": bad})
