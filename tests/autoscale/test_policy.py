"""The SLO policy YAML: the example loads, every bad file names its field and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscale.policy import PerfModelSource, PolicyError, SloPolicy, load_policy
from autoscale.signals import Pool

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "slo-policy.yaml"


def _bad(tmp_path: Path, text: str) -> PolicyError:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    return info.value


def test_example_loads_and_states_the_issue_workload() -> None:
    policy = load_policy(EXAMPLE)
    assert (policy.model_profile, policy.gpu, policy.gpu_budget) == ("llama-3.1-8b", "h100", 16)
    assert policy.slo.ttft_ms.target == 2000 and policy.slo.ttft_ms.percentile == 99
    assert policy.slo.itl_ms.target == 50
    assert policy.limits(Pool.PREFILL).startup_s == 120
    assert policy.role_switching is False
    # the example shows every default: it is the defaults plus the budget
    assert policy == SloPolicy(gpu_budget=16)


def test_text_and_path_string_load_the_same() -> None:
    assert load_policy(EXAMPLE.read_text()) == load_policy(str(EXAMPLE))
    assert load_policy("") == SloPolicy()


def test_unknown_field_names_path_and_line(tmp_path: Path) -> None:
    err = _bad(tmp_path, "gpu: h100\nslo:\n  ttft_ms:\n    target: 2000\n    percentlie: 90\n")
    assert [(i.path, i.line) for i in err.issues] == [("slo.ttft_ms.percentlie", 5)]
    assert "policy.yaml:5: slo.ttft_ms.percentlie: Extra inputs are not permitted" in str(err)


def test_min_above_max_names_the_pool_field(tmp_path: Path) -> None:
    err = _bad(tmp_path, "pools:\n  prefill:\n    max: 2\n  decode:\n    min: 5\n    max: 3\n")
    assert [(i.path, i.line) for i in err.issues] == [("pools.decode.min", 5)]
    assert "min (5) is above max (3)" in str(err)


def test_negative_target_names_field_and_line(tmp_path: Path) -> None:
    err = _bad(tmp_path, "slo:\n  itl_ms:\n    target: -50\n")
    assert [(i.path, i.line) for i in err.issues] == [("slo.itl_ms.target", 3)]
    assert "greater than 0" in err.issues[0].message


def test_target_in_the_wrong_unit_and_low_percentile(tmp_path: Path) -> None:
    err = _bad(tmp_path, "slo:\n  ttft_ms: {target: 2000000}\n")
    assert (err.issues[0].path, err.issues[0].line) == ("slo.ttft_ms.target", 2)
    assert "milliseconds" in err.issues[0].message
    err = _bad(tmp_path, "slo:\n  itl_ms:\n    percentile: 10\n    target: 50\n")
    assert (err.issues[0].path, err.issues[0].line) == ("slo.itl_ms.percentile", 3)


def test_budget_too_small_for_the_minimums(tmp_path: Path) -> None:
    pools = "pools:\n  prefill: {min: 2, gpus_per_replica: 2}\n  decode: {min: 3}\n"
    err = _bad(tmp_path, pools + "gpu_budget: 6\n")
    assert [(i.path, i.line) for i in err.issues] == [("gpu_budget", 4)]
    assert "prefill 2x2 + decode 3x1 = 7 GPUs" in str(err)
    assert load_policy(pools + "gpu_budget: 7").gpu_budget == 7


def test_sweep_file_is_relative_to_the_policy_and_must_exist(tmp_path: Path) -> None:
    err = _bad(tmp_path, "perf_model:\n  source: sweep\n  sweep_file: sweep.json\n")
    assert [(i.path, i.line) for i in err.issues] == [("perf_model.sweep_file", 3)]
    assert "no such file" in str(err)
    err = _bad(tmp_path, "perf_model:\n  source: sweep\n")
    assert [(i.path, i.line) for i in err.issues] == [("perf_model.sweep_file", 1)]
    (tmp_path / "sweep.json").write_text("{}")
    (tmp_path / "p.yaml").write_text("perf_model: {source: sweep, sweep_file: sweep.json}\n")
    policy = load_policy(tmp_path / "p.yaml")
    assert policy.perf_model.source is PerfModelSource.SWEEP
    assert policy.perf_model.sweep_file == str((tmp_path / "sweep.json").resolve())


def test_yaml_syntax_error_and_non_mapping(tmp_path: Path) -> None:
    err = _bad(tmp_path, "slo:\n  ttft_ms: [1,\n gpu: x\n")
    assert err.issues[0].line is not None and err.issues[0].message.startswith("YAML:")
    err = _bad(tmp_path, "- 1\n- 2\n")
    assert err.issues[0].message == "expected a mapping at the top level"


def test_every_problem_is_reported(tmp_path: Path) -> None:
    err = _bad(tmp_path, "tp: 0\npredictor: arima\nintervals:\n  reactive_s: 0\n")
    assert {(i.path, i.line) for i in err.issues} == {
        ("tp", 1),
        ("predictor", 2),
        ("intervals.reactive_s", 4),
    }


def test_unknown_hardware_and_a_model_that_does_not_fit(tmp_path: Path) -> None:
    err = _bad(tmp_path, "model_profile: llama-3.1-8b\ngpu: h1000\n")
    assert [(i.path, i.line) for i in err.issues] == [("gpu", 2)]
    assert "h100" in err.issues[0].message  # the valid names are listed
    err = _bad(tmp_path, "model_profile: llama-3.1-70b\ngpu: l40s\ntp: 1\n")
    assert [(i.path, i.line) for i in err.issues] == [("tp", 3)]


def test_planner_options_default_to_the_planners_own() -> None:
    import inspect

    from autoscale.planner import PdorchPlanner
    from autoscale.policy import PlannerOptions

    params = inspect.signature(PdorchPlanner.__init__).parameters
    for name, value in PlannerOptions().model_dump().items():
        assert params[name].default == value, name
    assert load_policy(EXAMPLE).planner == PlannerOptions()


def test_planner_options_reach_the_registered_planner(tmp_path: Path) -> None:
    from autoscale.perf_model import build_perf_model
    from autoscale.planner import PdorchPlanner
    from autoscale.planner_base import planner_factory

    path = tmp_path / "policy.yaml"
    path.write_text("planner:\n  release_after_ticks: 3\n  floor_hold_s: 90\n  trend_age: true\n")
    policy = load_policy(path)
    pl = planner_factory("pdorch")(policy, build_perf_model(policy))
    assert isinstance(pl, PdorchPlanner)
    assert (pl.floor_hold_s, pl.ahead_hold_s) == (90.0, 90.0)
    assert pl._release is not None and pl._release.ticks == 3
    assert pl._trend_age is not None
    # a keyword option still wins over the file's
    kw = planner_factory("pdorch")(policy, build_perf_model(policy), floor_hold_s=30.0)
    assert isinstance(kw, PdorchPlanner) and kw.floor_hold_s == 30.0


@pytest.mark.parametrize(
    ("text", "path", "why"),
    [
        ("planner:\n  headroom: 1.5\n", "planner.headroom", "less than or equal to 1"),
        ("planner:\n  release_after_ticks: -1\n", "planner.release_after_ticks", "greater"),
        ("planner:\n  release_after_ticks: 2.5\n", "planner.release_after_ticks", "integer"),
        ("planner:\n  trend_age: 'yes please'\n", "planner.trend_age", "boolean"),
        ("planner:\n  trend_cap: 0.5\n", "planner.trend_cap", "greater than or equal to 1"),
        ("planner:\n  floor_hold: 90\n", "planner.floor_hold", "Extra inputs"),
        ("planner:\n  reversal_ticks: 0\n", "planner.reversal_ticks", "greater than or equal"),
    ],
)
def test_bad_planner_options_name_the_field_and_line(
    tmp_path: Path, text: str, path: str, why: str
) -> None:
    err = _bad(tmp_path, text)
    assert [(i.path, i.line) for i in err.issues] == [(path, 2)]
    assert why in err.issues[0].message


def test_the_shipped_decode_defaults_are_round_14s() -> None:
    from autoscale.policy import PerfModelConfig, PlannerOptions

    perf, plan = SloPolicy().perf_model, SloPolicy().planner
    assert (perf.decode_burst_queue, perf.decode_burst_dispersion_online) == (True, True)
    assert perf.online_skip_decode_wait is True
    assert (plan.decode_wait_attribution, plan.budget_now_first) == (True, True)
    assert plan.cold_start_spare == {Pool.DECODE: 1.5}
    # the example file spells out every default, and `null` turns the spare off
    assert load_policy(EXAMPLE).perf_model == PerfModelConfig()
    off = SloPolicy.model_validate({"planner": {"cold_start_spare": None}})
    assert off.planner.cold_start_spare is None
    # each policy gets its own dict (a default_factory), never one shared, mutable default
    assert PlannerOptions().cold_start_spare is not PlannerOptions().cold_start_spare
