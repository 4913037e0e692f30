"""The planner's load inputs: the built-in forecaster and the trace windows."""

from __future__ import annotations

import pytest

from autoscale.forecast_seam import EwmaForecaster, LoadForecast, PredictorForecaster
from autoscale.load_window import (
    LoadWindow,
    future_from_requests,
    mean_window,
    split_windows,
    window_of,
)
from autoscale.policy import PredictorKind
from tests.autoscale.obs import observation


def test_ewma_forecaster_smooths_and_ignores_idle_lengths() -> None:
    f = EwmaForecaster(alpha=0.5)
    assert f.forecast(60.0) == LoadForecast(0.0, 0.0, 0.0, 0.0)
    f.observe(observation(rate=10.0, isl=1000.0, osl=100.0, hit=0.2))
    f.observe(observation(rate=20.0, isl=2000.0, osl=300.0, hit=0.4))
    assert f.forecast(0.0) == pytest.approx((15.0, 1500.0, 200.0, 0.3))
    f.observe(observation(rate=0.0, isl=0.0, osl=0.0))  # idle: only the rate moves
    assert f.forecast(120.0) == pytest.approx((7.5, 1500.0, 200.0, 0.3))
    last = EwmaForecaster(alpha=1.0)
    last.observe(observation(rate=3.0))
    last.observe(observation(rate=5.0))
    assert last.forecast(0.0)[0] == 5.0
    with pytest.raises(ValueError, match="alpha"):
        EwmaForecaster(alpha=0.0)


def test_windows_of_a_trace() -> None:
    reqs = [(0.0, 100, 10, 0.0), (1.0, 300, 30, 1.0), (2.5, 100, 10, 0.5)]
    w = window_of(reqs, 0.0, 2.0)
    assert (w.arrival_rps, w.mean_isl_tokens, w.mean_osl_tokens) == (1.0, 200.0, 20.0)
    assert w.prefix_hit_rate == pytest.approx(0.75)  # token-weighted: 300 of 400
    future = future_from_requests(list(reversed(reqs)))
    assert future(0.0, 2.0) == w and future(5.0, 6.0).arrival_rps == 0.0
    parts = split_windows(reqs, 2.0)
    assert [p.start_s for p in parts] == [0.0, 2.0]
    m = mean_window([LoadWindow(0, 10, 1.0, 100, 10), LoadWindow(10, 10, 3.0, 200, 10)])
    assert m.arrival_rps == 2.0 and m.mean_isl_tokens == pytest.approx(175.0)


def _burst_then_short_prompts(forecaster: PredictorForecaster) -> float:
    """16 prompts of 5.5k tokens in one 0.25 s window, 2 s idle, then short prompts at 40 rps:
    the prefill load (forecast rate x ISL, tokens/s) the forecaster answers in that window."""
    t = 0.0
    for rate, isl in [(4.0, 160.0)] * 4 + [(64.0, 5500.0)] + [(0.0, 0.0)] * 8 + [(40.0, 160.0)]:
        t += 0.25
        forecaster.observe(observation(t, rate=rate, isl=isl, window_s=0.25))
    f = forecaster.forecast(0.0)
    return f.rate_rps * f.isl_tokens


def test_request_weighted_isl_does_not_multiply_a_bursts_lag_into_phantom_load() -> None:
    # the window's real prefill load: 40 rps x 160 tokens = 6.4k tokens/s
    kind = PredictorKind.HOLT
    apart = _burst_then_short_prompts(PredictorForecaster(kind))
    weighted = _burst_then_short_prompts(PredictorForecaster(kind, request_weighted_isl=True))
    assert apart > 3 * 6_400.0  # the ISL level still carries the burst: several times the load
    assert weighted < 2 * 6_400.0
