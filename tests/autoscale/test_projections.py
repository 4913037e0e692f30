"""The two projection rules of `autoscale.projections` (Round 6), alone and in the planner
(LinearPerfModel: prefill 8k tok/s per replica at target; 1000-token prompts)."""

from __future__ import annotations

from typing import Any

import pytest

from autoscale.projections import AheadRelease, Projection, TrendAge
from autoscale.signals import Pool
from tests.autoscale.obs import observation, policy
from tests.autoscale.test_planner import AheadForecaster, planner

P = Pool.PREFILL


def test_trend_age_projects_the_growth_only_over_the_time_the_trend_was_seen() -> None:
    age = TrendAge()
    # level 8, projected 20 at 120 s: first seen this tick (age = one 5 s tick) -> 8 + 12 * 5/120
    assert age.damp(0.0, 8.0, 20.0, 120.0, 5.0) == pytest.approx(8.5)
    assert age.damp(0.0, 8.0, 20.0, 120.0, 5.0) == pytest.approx(8.5)  # same tick, same age
    assert age.damp(55.0, 8.0, 20.0, 120.0, 5.0) == pytest.approx(14.0)  # 60 s of trend
    assert age.damp(115.0, 8.0, 20.0, 120.0, 5.0) == pytest.approx(20.0)  # the whole horizon
    assert age.damp(200.0, 8.0, 20.0, 120.0, 5.0) == pytest.approx(20.0)  # never above it
    # a tick without growth ends the trend: the next one starts from one tick again
    assert age.damp(205.0, 8.0, 7.0, 120.0, 5.0) == 7.0
    assert age.damp(210.0, 8.0, 20.0, 120.0, 5.0) == pytest.approx(8.5)


def test_a_projection_is_released_after_k_ticks_below_its_path_and_sets_a_bar() -> None:
    rel = AheadRelease(3, keep_s=180.0)
    p = rel.track(Projection(0.0, 8.0, 20.0, 120.0))  # path: 8 + 0.1 rps per second
    assert p.path(60.0) == pytest.approx(14.0) and p.path(500.0) == 20.0
    rel.observe(5.0, 8.0)  # below 8.5: one miss
    rel.observe(10.0, 9.5)  # above 9.0: the count starts again
    assert p.misses == 0 and not p.released
    for t in (15.0, 20.0):
        rel.observe(t, 8.0)
    assert not p.released and not rel.suppressed
    rel.observe(25.0, 8.0)  # the third tick in a row below the path
    assert p.released and rel.bar == pytest.approx(10.5) and rel.suppressed
    rel.observe(30.0, 10.0)  # still below the bar
    assert rel.suppressed
    rel.observe(35.0, 10.5)  # the level reached what was released: projections count again
    assert not rel.suppressed
    # a flat projection has nothing to release and is not watched
    flat = rel.track(Projection(40.0, 8.0, 8.0, 120.0))
    for t in (45.0, 50.0, 55.0, 60.0):
        rel.observe(t, 1.0)
    assert not flat.released and not rel.suppressed
    with pytest.raises(ValueError):
        AheadRelease(0, keep_s=180.0)


def _ahead_at(**options: Any) -> dict[int, float]:
    """The floor's projected rate per tick: 8 rps now, 20 rps forecast at +120 s, except at
    t = 60 (no growth)."""
    fc = AheadForecaster(alpha=1.0)
    pl = planner(forecaster=fc, trend_cap=3.0, trend_hold_s=0.0, **options)
    out = {}
    for t in range(0, 80, 5):
        fc.ahead = 8.0 if t == 60 else 20.0
        d = pl.plan(observation(float(t), rate=8.0, p=(4, 0), d=(8, 0)))
        out[t] = d.details["prefill"]["floor_inputs"]["rate_rps"]
    return out


def test_trend_age_sizes_the_opening_order_by_the_trend_seen_so_far() -> None:
    main = _ahead_at()  # the default: the whole projection at once
    assert main[0] == 20.0 and main[55] == 20.0
    aged = _ahead_at(trend_age=True)
    assert aged[0] == pytest.approx(8.5) and aged[55] == pytest.approx(14.0)
    # t = 60 projects no growth (the floor for the load now, 8 rps); t = 65 starts afresh
    assert aged[60] == 8.0 and aged[65] == pytest.approx(8.5)


def _released(**options: Any) -> dict[int, int]:
    """4 prefill replicas at 8 rps (the fit check allows 2); at t = 30 and again at t = 100
    the forecast for +120 s is 24 rps (a floor of 3) while the level stays at 8 rps."""
    fc = AheadForecaster(alpha=1.0)
    pl = planner(policy(down_s=600.0), forecaster=fc, trend_cap=3.0, trend_hold_s=0.0, **options)
    out = {}
    for t in range(0, 135, 5):
        fc.ahead = 24.0 if t in (30, 100) else 8.0
        out[t] = pl.plan(observation(float(t), rate=8.0, p=(4, 0), d=(8, 0))).desired[P]
    return out


def test_an_unmet_projection_stops_holding_the_pool_and_does_not_reorder() -> None:
    # the default holds the t = 30 floor of 3 through the 600 s window (to t = 130 here), and
    # orders the t = 100 projection again
    main = _released()
    assert main[95] == 3 and main[130] == 3
    # released after 3 ticks below its path (t = 45): only the fit minute's raw count of 3
    # (t = 30) holds, to t = 90; the level (8) stays under the bar (8 + 16 * 15/120 = 10), so
    # the t = 100 projection orders nothing: no 2 -> 3 -> 2
    rel = _released(release_after_ticks=3)
    assert rel[60] == rel[90] == 3 and rel[95] == 2
    assert all(rel[t] == 2 for t in range(95, 135, 5))
    # `ahead_hold_s` 0 (Round 5) releases it too, but re-orders at t = 100: the flap
    short = _released(ahead_hold_s=0.0)
    assert short[95] == 2 and short[100] == 3


def test_cold_start_growth_sizes_the_floor_ahead_for_the_growth_a_cold_start_must_absorb() -> None:
    # a flat forecast (EWMA, alpha 1): 9 rps, 1000 + 200 tokens. Decode by Little's law at the
    # target: 9 * (0.1 + 200 * 0.05) = 90.9 sequences over 100 per replica -> 1. With growth
    # 2.5 the floor for the load 120 s ahead is sized for 22.5 rps: 227.25 / 100 -> 3; prefill
    # (9k tok/s over 8k -> 2) keeps its level: the growth is per pool
    flat = planner().plan(observation(rate=9.0, p=(2, 0), d=(1, 0)))
    assert flat.desired[Pool.DECODE] == 1 and flat.desired[P] == 2
    grown = planner(cold_start_growth={Pool.DECODE: 2.5}).plan(
        observation(rate=9.0, p=(2, 0), d=(1, 0))
    )
    assert grown.desired[Pool.DECODE] == 3 and grown.reasons[Pool.DECODE] == "itl-concurrency"
    inputs = grown.details["decode"]["floor_inputs"]
    assert inputs["horizon_s"] == 120.0 and inputs["rate_rps"] == pytest.approx(22.5)
    assert grown.desired[P] == 2


def test_cold_start_growth_is_a_minimum_a_larger_projection_still_wins() -> None:
    # the forecast ahead is 24 rps (3x the 8 rps level, under trend_cap 3): growth 1.5 (12 rps)
    # does not bind; decode for 24 rps: 24 * 10.1 = 242.4 / 100 -> 3
    fc = AheadForecaster(alpha=1.0)
    fc.ahead = 24.0
    pl = planner(forecaster=fc, trend_cap=3.0, trend_hold_s=0.0, cold_start_growth={"decode": 1.5})
    d = pl.plan(observation(rate=8.0, p=(4, 0), d=(1, 0)))
    assert d.details["decode"]["floor_inputs"]["rate_rps"] == pytest.approx(24.0)
    assert d.desired[Pool.DECODE] == 3


def test_cold_start_growth_is_checked_in_the_policy() -> None:
    assert policy().planner.cold_start_growth is None
    on = policy(planner={"cold_start_growth": {"decode": 2.5}})
    assert on.planner.cold_start_growth == {Pool.DECODE: 2.5}
    with pytest.raises(ValueError, match="cold_start_growth"):
        policy(planner={"cold_start_growth": {"decode": 0.5}})
    with pytest.raises(ValueError, match="cold_start_growth"):
        policy(planner={"cold_start_growth": {"gpu": 2.0}})
