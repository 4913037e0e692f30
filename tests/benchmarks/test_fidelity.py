"""The fidelity benchmark's pure parts (benchmarks/fidelity_*.py): the committed report is what
the code renders from the committed result, and the virtual replay keeps the structure the fit
relies on."""

from __future__ import annotations

import json

import pytest

from benchmarks.fidelity import RESULTS
from benchmarks.fidelity_fit import _cpu_timing, profile_constants, virtual_run
from benchmarks.fidelity_measure import MAX_TOKENS, PROMPT_LENGTHS, workload
from benchmarks.fidelity_report import render


def test_the_committed_report_renders_from_the_committed_result() -> None:
    result = json.loads((RESULTS / "fidelity.json").read_text())
    assert render(result) == (RESULTS / "fidelity.md").read_text()


def test_replay_at_concurrency_1_times_each_first_token_by_its_own_step() -> None:
    # `_metric_weights` writes a TTFT target as the duration of the step that made the first
    # token: true at concurrency 1, where a request arrives to an idle engine.
    constants = profile_constants()
    prompts = workload(seed=0, repeats=1)
    run = virtual_run(constants, prompts, concurrency=1)
    model = _cpu_timing(constants)
    assert sorted(t.prompt_len for t in run.timings) == sorted(PROMPT_LENGTHS)
    for timing, step in zip(run.timings, run.ttft_steps, strict=True):
        t, s, a, r, n = run.steps[step]
        assert timing.ttft_s == pytest.approx(model.step_time(t, s, a, r, num_new_seqs=n))
    for first, last in run.spans:  # every later token takes one step of its own
        assert last - first == MAX_TOKENS - 1
