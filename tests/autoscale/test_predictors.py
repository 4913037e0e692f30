"""Load predictors on synthetic series with known answers."""

from __future__ import annotations

import math

import pytest

from autoscale.policy import PredictorKind, PredictorParams, SloPolicy
from autoscale.predictors import (
    ConstantPredictor,
    EwmaPredictor,
    HoltPredictor,
    KalmanPredictor,
    LoadForecaster,
    Predictor,
    make_predictor,
)
from autoscale.signals import Observation


def _feed(p: Predictor, values: list[float], dt: float = 60.0) -> Predictor:
    for i, v in enumerate(values):
        p.observe(v, i * dt)
    return p


ALL_KINDS = list(PredictorKind)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_nothing_observed_forecasts_none(kind: PredictorKind) -> None:
    assert make_predictor(kind).forecast(60.0) is None


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_constant_series_forecasts_the_constant(kind: PredictorKind) -> None:
    p = _feed(make_predictor(kind), [7.5] * 20)
    assert p.forecast(0.0) == pytest.approx(7.5)
    assert p.forecast(600.0) == pytest.approx(7.5)


def test_constant_predictor_is_the_last_value() -> None:
    assert _feed(ConstantPredictor(), [1.0, 5.0, 3.0]).forecast(1e6) == 3.0


def test_ewma_step_response_matches_closed_form() -> None:
    alpha = 0.3
    p = _feed(EwmaPredictor(alpha), [0.0] * 5 + [1.0] * 8)
    # after n = 8 observations of 1 from a state of 0: 1 - (1 - alpha)^n
    assert p.forecast(0.0) == pytest.approx(1 - (1 - alpha) ** 8, rel=1e-12)


@pytest.mark.parametrize("dt", [5.0, 60.0])
def test_holt_converges_to_the_ramp_slope(dt: float) -> None:
    slope_per_s = 0.02
    values = [3.0 + slope_per_s * i * dt for i in range(60)]
    p = _feed(HoltPredictor(alpha=0.5, beta=0.3), values, dt)
    assert isinstance(p, HoltPredictor)
    assert p.trend_per_s == pytest.approx(slope_per_s, rel=1e-6)
    last_t = 59 * dt
    assert p.forecast(120.0) == pytest.approx(3.0 + slope_per_s * (last_t + 120.0), rel=1e-6)


def test_holt_handles_uneven_spacing() -> None:
    p = HoltPredictor()
    for t in [0.0, 10.0, 15.0, 40.0, 41.0, 70.0, 100.0, 130.0, 131.0, 160.0] * 1:
        p.observe(2.0 * t, t)
    assert p.trend_per_s == pytest.approx(2.0, rel=1e-9)


def test_kalman_converges_to_the_ramp_slope_with_dynamo_defaults() -> None:
    dt = 60.0
    per_step = 3.0  # +3 requests/s every interval
    values = [10.0 + per_step * i for i in range(80)]
    p = _feed(KalmanPredictor(), values, dt)
    assert isinstance(p, KalmanPredictor)
    assert p.trend == pytest.approx(per_step, rel=1e-3)
    # one step ahead is the next ramp value
    assert p.forecast(dt) == pytest.approx(10.0 + per_step * 80, rel=1e-3)


def test_kalman_answers_the_last_value_until_min_points() -> None:
    p = _feed(KalmanPredictor(min_points=5), [1.0, 2.0, 3.0, 4.0])
    assert p.forecast(600.0) == 4.0
    p.observe(5.0, 240.0)
    assert p.forecast(600.0) != 5.0


def test_kalman_smooths_noise_toward_the_mean() -> None:
    noisy = [100.0 + (10.0 if i % 2 else -10.0) for i in range(200)]
    forecast = _feed(KalmanPredictor(q_level=0.01, q_trend=0.0001, r=100.0), noisy).forecast(0)
    assert forecast is not None and abs(forecast - 100.0) < 3.0


def test_repeated_or_older_now_is_ignored() -> None:
    p = EwmaPredictor(0.5)
    p.observe(1.0, 10.0)
    p.observe(100.0, 10.0)
    p.observe(100.0, 5.0)
    assert (p.forecast(0), p.count) == (1.0, 1)


def test_bad_parameters_raise() -> None:
    with pytest.raises(ValueError):
        EwmaPredictor(0.0)
    with pytest.raises(ValueError):
        HoltPredictor(alpha=1.5)
    with pytest.raises(ValueError):
        KalmanPredictor(r=0.0)


def _obs(
    now: float, rps: float, n: int, isl: float, osl: float, hit: float, window_s: float = 60.0
) -> Observation:
    return Observation(
        now=now,
        window_s=window_s,
        pools={},
        num_requests=n,
        arrival_rps=rps,
        mean_isl_tokens=isl,
        mean_osl_tokens=osl,
        prefix_hit_rate=hit,
    )


def test_load_forecaster_tracks_each_series_from_the_policy() -> None:
    policy = SloPolicy()
    assert policy.predictor is PredictorKind.HOLT
    f = LoadForecaster(policy.predictor, policy.predictor_params)
    for i in range(30):
        f.observe(_obs(60.0 * i, 1.0 + 0.01 * 60 * i, 100, 2000.0, 300.0, 0.25))
    out = f.forecast(120.0)
    assert out.now == 60.0 * 29
    assert out.arrival_rps == pytest.approx(1.0 + 0.01 * (60 * 29 + 120), rel=1e-6)
    assert out.mean_isl_tokens == pytest.approx(2000.0)
    assert out.uncached_isl_tokens == pytest.approx(1500.0)
    assert out.mean_osl_tokens == pytest.approx(300.0)


def test_load_forecaster_skips_shape_of_empty_windows_and_clamps() -> None:
    f = LoadForecaster(PredictorKind.HOLT, PredictorParams())
    f.observe(_obs(0.0, 10.0, 600, 1000.0, 100.0, 0.9))
    f.observe(_obs(60.0, 5.0, 300, 1000.0, 100.0, 1.0))
    f.observe(_obs(120.0, 0.0, 0, 0.0, 0.0, 0.0))  # idle: says nothing about ISL/OSL/hit
    out = f.forecast(600.0)
    assert out.arrival_rps == 0.0  # falling trend clamped at 0
    assert out.mean_isl_tokens == pytest.approx(1000.0)
    assert out.prefix_hit_rate == 1.0  # rising trend clamped at 1
    peak = f.forecast_peak(600.0)
    assert peak.arrival_rps >= out.arrival_rps
    assert math.isclose(f.forecast(0.0).now, 120.0)


def test_an_idle_gap_does_not_project_the_shape_trend_through_it() -> None:
    f = LoadForecaster(PredictorKind.HOLT, PredictorParams())
    for i, isl in enumerate((1000.0, 3000.0, 5000.0)):  # ISL rising 2k per second
        f.observe(_obs(float(i), 10.0, 10, isl, 8.0, 0.0, window_s=1.0))
    at_burst = f.forecast(0.0).mean_isl_tokens
    for t in range(3, 30):  # 27 s with no requests
        f.observe(_obs(float(t), 0.0, 0, 0.0, 0.0, 0.0, window_s=1.0))
    # the rate has moved on; the prompt length is where the last requests left it
    assert f.forecast(0.0).mean_isl_tokens == pytest.approx(at_burst)
    assert f.forecast(0.0).mean_isl_tokens < 6000.0
    # nor does the next window's update add trend x gap: the level moves toward the new value
    f.observe(_obs(30.0, 1.0, 1, 200.0, 8.0, 0.0, window_s=1.0))
    assert f.forecast(0.0).mean_isl_tokens < at_burst


def test_load_forecaster_before_any_observation_is_zero() -> None:
    out = LoadForecaster(PredictorKind.KALMAN).forecast(60.0)
    assert (out.arrival_rps, out.mean_isl_tokens, out.prefix_hit_rate) == (0.0, 0.0, 0.0)
