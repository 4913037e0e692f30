"""The `diurnal` workload: curve shape, determinism per seed, the trace's ISL/OSL kept."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.workloads import Workload, load_workload
from benchmarks.workloads.diurnal import DiurnalParams, rate_curve
from benchmarks.workloads.load_profile import load_profile, rate_scale_for
from benchmarks.workloads.traces import AZURE_CONVERSATION, load_azure


@pytest.fixture(scope="module")
def day() -> Workload:
    return load_workload("diurnal", seed=1)


def test_curve_formula_night_and_two_peaks() -> None:
    p = DiurnalParams()
    t = np.linspace(0.0, p.duration_s, 24 * 60, endpoint=False)
    r = rate_curve(t, p)
    assert r.max() == pytest.approx(p.peak_rps, rel=1e-6)
    night = rate_curve(3 / 24 * p.duration_s, p)
    assert float(night) / p.peak_rps == pytest.approx(0.2, abs=0.01)
    inner = (r[1:-1] > r[:-2]) & (r[1:-1] > r[2:])
    maxima_h = (np.flatnonzero(inner) + 1) * 24 / len(t)
    assert maxima_h.tolist() == pytest.approx([11.0, 20.0], abs=0.1)
    assert rate_curve(20 / 24 * p.duration_s, p) / p.peak_rps == pytest.approx(0.88, abs=0.01)


def test_sampled_day_follows_curve(day: Workload) -> None:
    prof = load_profile(day, bin_s=60.0)
    assert len(prof.requests) == 120  # 2 h
    per_hour = [sum(prof.requests[h * 5 : h * 5 + 5]) / 300.0 for h in range(24)]  # req/s
    # Night (02:00-05:00 of the day) vs the late-morning peak hour, on the sampled arrivals.
    night = np.mean(per_hour[2:5])
    assert night / per_hour[11] == pytest.approx(0.2, abs=0.03)
    assert per_hour[11] == pytest.approx(10.0, rel=0.08)
    assert per_hour[15] < 0.6 * per_hour[11] and per_hour[15] < 0.6 * per_hour[20]
    assert per_hour[20] > 0.8 * per_hour[11]


def test_deterministic_per_seed() -> None:
    def key(seed: int) -> list[tuple[float | None, int, int]]:
        w = load_workload("diurnal", seed=seed, duration_s=600.0)
        return [(s.start_s, s.prompt_tokens(0), s.turns[0].output_tokens) for s in w.sessions]

    assert key(5) == key(5)
    assert key(5) != key(6)


def test_isl_osl_distribution_preserved(day: Workload) -> None:
    trace = load_azure(AZURE_CONVERSATION)
    t_isl = np.mean([s.prompt_tokens(0) for s in trace.sessions])
    t_osl = np.mean([s.turns[0].output_tokens for s in trace.sessions])
    sessions = day.sessions
    d_isl = np.mean([s.prompt_tokens(0) for s in sessions])
    d_osl = np.mean([s.turns[0].output_tokens for s in sessions])
    assert d_isl == pytest.approx(t_isl, rel=0.03)
    assert d_osl == pytest.approx(t_osl, rel=0.03)
    # More requests than trace rows: rows repeat, but every request has its own content.
    assert len(sessions) > len(trace.sessions)
    assert len({s.turns[0].new_segments[0].content_id for s in sessions}) == len(sessions)


def test_rate_scale_and_peak_rps_scale_the_rate_not_the_day() -> None:
    base = load_workload("diurnal", duration_s=1200.0)
    scaled = load_workload("diurnal", duration_s=1200.0, rate_scale=2.0)
    peak = load_workload("diurnal", duration_s=1200.0, peak_rps=20.0)
    for w in (base, scaled, peak):
        assert max(s.start_s or 0.0 for s in w.sessions) < 1200.0
    assert len(scaled.sessions) == pytest.approx(2 * len(base.sessions), rel=0.1)
    assert len(peak.sessions) == len(scaled.sessions)  # same Λ, same seed, same points


def test_bad_parameter_named() -> None:
    with pytest.raises(ValueError, match="night_ratio"):
        load_workload("diurnal", night_ratio=1.5)


def test_load_profile_by_hand() -> None:
    w = load_workload("rl-rollouts")  # closed loop: no arrivals to bin
    assert load_profile(w).requests == []
    w = load_workload(AZURE_CONVERSATION, max_requests=50)
    prof = load_profile(w, bin_s=10.0)
    assert sum(prof.requests) == 50
    assert sum(prof.prefill_tokens) == sum(s.prompt_tokens(0) for s in w.sessions)
    full = prof.prefill_tokens[: prof.full_bins]
    assert prof.prefill_peak_mean_ratio == pytest.approx(
        max(prof.prefill_tokens) * len(full) / sum(full)
    )
    scale = rate_scale_for(prof, 2 * prof.peak_prefill_tokens_per_s)
    assert scale == pytest.approx(2.0)
