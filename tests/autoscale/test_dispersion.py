"""The learnt burst dispersion (`autoscale/dispersion.py`), against hand-computed series."""

from __future__ import annotations

import pytest

from autoscale.dispersion import ArrivalDispersion
from autoscale.forecast_seam import EwmaForecaster
from autoscale.perf_model import TimingPerfModel
from autoscale.planner_terms import decode_floor_need
from autoscale.signals import Pool
from autoscale.sizing import decode_need
from pools.sim.timing import make_timing
from tests.autoscale.obs import observation, pinned_planner, policy


def _fed(counts: list[int], history_s: float = 300.0) -> ArrivalDispersion:
    est = ArrivalDispersion(16.0, history_s=history_s)
    for i, n in enumerate(counts):
        est.observe(5.0 * (i + 1), n, 5.0)
    return est


def test_the_prior_stands_until_a_minute_of_windows_with_arrivals() -> None:
    assert _fed([10] * 11).value() == 16.0
    assert _fed([0] * 20).value() == 16.0  # nothing arrived: nothing learnt
    assert _fed([10] * 12).value() == 1.0  # constant counts: no variance, floored at Poisson


def test_the_variance_is_read_from_successive_differences() -> None:
    # 0, 20, 0, 20, ...: every difference 20, so 400 / 2 = 200 over the mean 10: I = 20
    assert _fed([0, 20] * 10).value() == pytest.approx(20.0)
    # clusters of 14 (the Azure overlay): 14 or 28 alternating, differences 14: 98 / 21 = 4.67
    assert _fed([14, 28] * 10).value() == pytest.approx(98 / 21)


def test_a_ramp_is_not_read_as_dispersion() -> None:
    # counts grow 2 a window (a steady ramp): differences 2, variance 2, mean ~ 29: floored at 1
    assert _fed(list(range(10, 50, 2))).value() == 1.0


def test_only_the_last_history_s_counts() -> None:
    est = _fed([0, 20] * 10 + [10] * 60, history_s=300.0)  # the bursty minute has aged out
    assert est.value() == 1.0
    assert _fed([0, 20] * 10 + [10] * 50, history_s=300.0).value() > 1.0  # 10 bursty left


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        ArrivalDispersion(0.5)
    with pytest.raises(ValueError):
        ArrivalDispersion(16.0, min_windows=1)


def test_the_decode_floor_reads_the_learnt_dispersion() -> None:
    pol = policy(perf_model={"decode_burst_queue": True, "decode_burst_dispersion_online": True})
    perf = TimingPerfModel(make_timing("llama-3.1-8b", "h100"))
    planner = pinned_planner(pol, perf, forecaster=EwmaForecaster())
    # 40 rps as 150 / 250 requests a 5 s window (alternating): differences 100, variance
    # 5,000, mean 200: I = 25
    for i in range(24):
        rate = 30.0 if i % 2 == 0 else 50.0
        d = planner.plan(observation(5.0 * (i + 1), rate=rate))
    inputs = d.details["decode"]["floor_inputs"]
    assert inputs["dispersion"] == pytest.approx(25.0)
    want = decode_floor_need(
        perf, pol, inputs["rate_rps"], 1000.0, 200.0, 0.0, 1.0, 0.9, dispersion=25.0
    )
    assert inputs["need"] == pytest.approx(want)
    # and that is the burst quantile at I = 25, not at the fixed 16
    t = min(perf.prefill_time_s(1000), 2.0)
    at = {
        i: decode_need(
            perf, inputs["rate_rps"], 1000.0, 200.0, 0.05, ttft_term_s=t, headroom=0.9,
            burst_dispersion=i,
        )
        for i in (16.0, 25.0)
    }  # fmt: skip
    assert inputs["need"] == pytest.approx(at[25.0]) and at[25.0] > at[16.0]
    # off by default: the fixed I, no learnt input
    off = pinned_planner(policy(perf_model={"decode_burst_queue": True}), perf)
    d = off.plan(observation(5.0, rate=40.0))
    assert "dispersion" not in d.details["decode"]["floor_inputs"]
    assert Pool.DECODE in d.desired
