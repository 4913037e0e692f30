"""Round 15: the prefill pool's own way down (`autoscale.prefill_down`): its scale-down window
(`prefill_scale_down_s`) and the release of the floors ahead on a sustained fall
(`prefill_fall_release`) and the prefill consolidation check's margin (`prefill_fit_margin`)
(LinearPerfModel: prefill 8k tok/s per replica at the target;
1000-token prompts, so 8 rps fill one replica)."""

from __future__ import annotations

from typing import Any

import pytest

from autoscale.forecast_seam import EwmaForecaster, LoadForecast
from autoscale.policy import Intervals
from autoscale.prefill_down import FallGate, prefill_windows
from autoscale.signals import Pool
from autoscale.stabilization import PoolStabilizer, Windows
from tests.autoscale.obs import observation, policy, replicas
from tests.autoscale.test_planner import planner

P, D = Pool.PREFILL, Pool.DECODE


def test_prefill_windows_take_the_own_window_and_bound_the_floor_holds_by_it() -> None:
    w = Windows(0.0, 180.0, 60.0, 180.0, 180.0)
    assert prefill_windows(w, None) is w  # off: the planner's windows
    assert prefill_windows(w, 60.0) == Windows(0.0, 60.0, 60.0, 60.0, 60.0)
    # a floor hold already shorter than the window stays as it is
    assert prefill_windows(Windows(0.0, 180.0, 60.0, 30.0, 0.0), 90.0) == Windows(
        0.0, 90.0, 60.0, 30.0, 0.0
    )
    # never longer than the planner's own window (the live example's 30 s stays 30 s)
    assert prefill_windows(Windows(0.0, 30.0, 30.0, 30.0, 30.0), 90.0) == Windows(
        0.0, 30.0, 30.0, 30.0, 30.0
    )


def _idle_after_busy(**options: Any) -> dict[float, tuple[int, int]]:
    """32 rps at t = 0 (prefill floor 32k / 8k = 4), idle after: (prefill, decode) desired."""
    pl = planner(policy(down_s=180.0, intervals=Intervals(predictive_s=5.0)), **options)
    out = {}
    for t in range(0, 190, 5):
        d = pl.plan(observation(float(t), rate=32.0 if t == 0 else 0.0, p=(4, 0), d=(8, 0)))
        out[float(t)] = (d.desired[P], d.desired[D])
    return out


def test_the_prefill_pool_goes_down_after_its_own_window_and_decode_keeps_the_planners() -> None:
    # default: the t = 0 floor of 4 holds both ways down for the 180 s window: 4 until t = 180,
    # 1 at t = 185 (the t = 0 tick is out of the window)
    plain = _idle_after_busy()
    assert plain[60.0][0] == plain[180.0][0] == 4 and plain[185.0][0] == 1
    # 60 s: watched 65 s >= 60, the raw counts of the last 60 s are all 1 and the idle load
    # fits 1 -> 1 at t = 65; decode (floor 8 at 32 rps, its 180 s window) is untouched
    own = _idle_after_busy(prefill_scale_down_s=60.0)
    assert own[60.0][0] == 4 and own[65.0][0] == 1
    assert [own[t][1] for t in own] == [plain[t][1] for t in plain]


def test_fall_gate_reads_the_mean_relative_growth_of_the_window() -> None:
    gate = FallGate(window_s=30.0)
    assert gate.observe(0.0, 10.0, 10.0) is False  # flat: mean 0
    assert gate.observe(5.0, 10.0, 8.0) is True  # (0 - 0.2) / 2 = -0.1: at -FALL
    assert gate.observe(10.0, 10.0, 10.5) is False  # (0 - 0.2 + 0.05) / 3 = -0.05
    # the window keeps t >= 10: (0.05 - 0.1) / 2 = -0.025
    assert gate.observe(40.0, 10.0, 9.0) is False
    assert gate.observe(45.0, 10.0, 5.0) is True  # (0.05 - 0.1 - 0.5) / 3 = -0.183
    assert FallGate(30.0).observe(0.0, 0.0, 0.0) is False  # no level: no fall


def test_a_released_stabilizer_drops_the_floors_ahead_but_keeps_the_floors_now() -> None:
    # floors ahead of 6 recorded at t = 0 and 2 since; the fit count is 2
    st = PoolStabilizer(Windows(0.0, 180.0, 60.0, 180.0, 180.0))
    st.record_floor(0.0, (2, 2), (6, 6), None)
    for t in range(5, 130, 5):
        st.record_floor(float(t), (2, 2), (2, 2), None)
        st.decide(float(t), 2, 2, "ttft-throughput", 6, float(t), lambda start, cur: start)
    assert st._fast_down(125.0, 6, 125.0) == 6  # the 180 s hold keeps the floor ahead of 6
    st.ahead_released = True
    assert st._fast_down(125.0, 6, 125.0) == 2
    # a floor for the load now of 5 at t = 0 keeps its window
    st2 = PoolStabilizer(Windows(0.0, 180.0, 60.0, 180.0, 180.0), ahead_released=True)
    st2.record_floor(0.0, (5, 5), (6, 6), None)
    for t in range(5, 130, 5):
        st2.record_floor(float(t), (2, 2), (2, 2), None)
        st2.decide(float(t), 2, 2, "ttft-throughput", 6, float(t), lambda start, cur: start)
    assert st2._fast_down(125.0, 6, 125.0) == 5


class StepForecaster(EwmaForecaster):
    """8 rps now; `ahead` rps at 120 s (set by the test between ticks)."""

    ahead = 8.0

    def forecast(self, horizon_s: float) -> LoadForecast:
        return LoadForecast(8.0 if horizon_s < 60.0 else self.ahead, 1000.0, 200.0, 0.0)


def _after_a_ramp_forecast(after: float, **options: Any) -> dict[int, int]:
    """4 prefill replicas at 8 rps (the fit check allows 2: 8k <= 0.8 * 2 * 8k); at t = 30 the
    forecast for +120 s is 24 rps (a floor of 3), then `after` rps."""
    fc = StepForecaster(alpha=1.0)
    pl = planner(policy(down_s=600.0), forecaster=fc, trend_cap=3.0, trend_hold_s=0.0, **options)
    out = {}
    for t in range(0, 135, 5):
        fc.ahead = 24.0 if t == 30 else (8.0 if t < 30 else after)
        d = pl.plan(observation(float(t), rate=8.0, p=(4, 0), d=(8, 0)))
        out[t] = d.desired[P]
        if options.get("prefill_fall_release") and t > 30:
            assert d.details["prefill_ahead_released"] is (after <= 7.2)
    return out


def test_a_sustained_fall_releases_the_floor_ahead_of_a_ramp_tick() -> None:
    # the t = 30 raw count of 3 bounds the fit minute (to t = 90) either way; without the rule
    # its floor ahead of 3 holds the fast path for the 600 s window (3 at t = 130)
    assert _after_a_ramp_forecast(6.0)[130] == 3
    # forecast 6 rps after t = 30: growth (6 - 8) / 8 = -0.25 <= -0.1: 2 from t = 95
    fall = _after_a_ramp_forecast(6.0, prefill_fall_release=True)
    assert fall[55] == 4 and fall[60] == fall[90] == 3 and fall[95] == 2
    # a flat forecast after t = 30 is no fall: the floor ahead holds as before
    assert _after_a_ramp_forecast(8.0, prefill_fall_release=True)[130] == 3


def _prefill_after_a_fit_minute(**options: Any) -> int:
    """4 prefill replicas at 7 rps = 7k tok/s (floor 7k / 8k = 0.875 -> 1) for 60 s."""
    pl = planner(policy(down_s=600.0), **options)
    for t in range(0, 65, 5):
        d = pl.plan(observation(float(t), rate=7.0, p=(4, 0), d=(8, 0)))
    return d.desired[P]


def test_the_prefill_fit_margin_moves_the_prefill_check_alone() -> None:
    # margin 0.8: 7k > 0.8 * 1 * 8k = 6.4k, 1 does not fit, 2 does -> 2 after the fit minute;
    # 0.9: 7k <= 7.2k and t_own 0.1 s <= 1.8 s -> 1
    assert _prefill_after_a_fit_minute() == 2
    assert _prefill_after_a_fit_minute(prefill_fit_margin=0.9) == 1
    # decode keeps `margin` 0.8: 250 sequences on 3 replicas step 43.6 ms > 0.8 * 50 ms -> 4
    # (at 0.9, 45 ms, 3 would fit)
    reps = replicas(D, 5, num_running=50)
    obs = observation(rate=0.1, d=(5, 0), reps=reps)
    for fm in (None, 0.9):
        d = planner(decode_fit_as_floor=False, prefill_fit_margin=fm).plan(obs)
        assert d.desired[D] == 4 and d.reasons[D] == "consolidation"
    assert planner(decode_fit_as_floor=False, margin=0.9).plan(obs).desired[D] == 3


def test_prefill_down_options_are_checked_in_the_policy() -> None:
    pl = policy().planner
    # the window is on by default since Round 16 (90 s); the fall release stays off
    assert pl.prefill_scale_down_s == 90.0 and pl.prefill_fall_release is False
    assert policy(planner={"prefill_scale_down_s": None}).planner.prefill_scale_down_s is None
    assert policy(planner={"prefill_scale_down_s": 60}).planner.prefill_scale_down_s == 60.0
    assert policy(planner={"prefill_fall_release": True}).planner.prefill_fall_release is True
    with pytest.raises(ValueError, match="prefill_scale_down_s"):
        policy(planner={"prefill_scale_down_s": -1})
    with pytest.raises(ValueError, match="prefill_fall_release"):
        policy(planner={"prefill_fall_release": "yes"})
    assert policy().planner.prefill_fit_margin is None  # off: the planner's margin
    assert policy(planner={"prefill_fit_margin": 0.9}).planner.prefill_fit_margin == 0.9
    for bad in (0, 1.1):
        with pytest.raises(ValueError, match="prefill_fit_margin"):
            policy(planner={"prefill_fit_margin": bad})
