"""Fitting the timing model's constants to a sweep: exact on a sweep the formula made, and the
errors it states follow the documented conventions."""

from __future__ import annotations

import pytest

from autoscale.perf_sweep import Sweep, timing_sweep
from benchmarks.perf_model_fit import evaluate, fit_sweep, gpu_with
from pools.sim.profiles import get_model
from pools.sim.timing import TimingModel

TRUE = {
    "mfu": 0.3,
    "step_overhead_s": 2e-3,
    "per_seq_overhead_s": 1e-4,
    "per_token_overhead_s": 5e-6,
    "per_new_seq_overhead_s": 4e-3,
}


def made_by(constants: dict[str, float]) -> Sweep:
    timing = TimingModel(get_model("tiny"), gpu_with("cpu", constants))
    return timing_sweep(
        timing,
        model_profile="tiny",
        gpu="cpu",
        isl_tokens=(32, 128, 512, 1024, 1536),
        batches=(1, 4, 8, 16),
        context_tokens=(128, 512),
    )


def test_a_sweep_the_formula_made_is_fitted_exactly() -> None:
    fit = fit_sweep(made_by(TRUE))
    for name, value in TRUE.items():
        assert fit["constants"][name] == pytest.approx(value, rel=1e-6), name
    for curve in fit["summary"].values():
        assert curve["max_abs_error"] < 1e-9


def test_errors_are_tokens_per_s_for_prefill_and_step_time_for_decode() -> None:
    sweep = made_by(TRUE)
    slow = 1536  # this prefill point measured twice as slow as the formula can follow
    sweep.prefill[slow] *= 2.0
    fit = fit_sweep(sweep)
    row = next(r for r in fit["prefill"] if r["isl_tokens"] == slow)
    assert row["error"] == pytest.approx(row["measured_s"] / row["model_s"] - 1.0)
    assert row["measured_tokens_per_s"] == pytest.approx(slow / row["measured_s"])
    assert row["error"] > 0.1  # the model, fitted to all points, cannot reach this one
    for d in fit["decode"]:
        assert d["error"] == pytest.approx(d["model_s"] / d["measured_s"] - 1.0)
    summary = fit["summary"]["prefill_tokens_per_s"]
    assert summary["max_abs_error"] == pytest.approx(max(abs(r["error"]) for r in fit["prefill"]))


def test_a_fit_evaluated_on_another_engine_shows_that_engines_distance() -> None:
    fit = fit_sweep(made_by(TRUE))
    slower = made_by({**TRUE, "step_overhead_s": 3 * TRUE["step_overhead_s"]})
    other = evaluate(slower, fit["constants"])
    assert all(d["error"] < 0 for d in other["decode"])  # the fitted model is too fast there
    assert other["summary"]["decode_step_s"]["median_abs_error"] > 0.05
