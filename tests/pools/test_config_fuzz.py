"""Fuzzing the fleet and SLO-policy YAML loaders (issue 14 item 3), with hypothesis.

Any YAML text, and any mutation of the committed example files (a field set to a value of
another type, a key dropped, an unknown key added), must end in success or in the loader's
own error (`FleetConfigError` / `PolicyError`, pydantic's findings mapped to issues) whose
issues name the field (`pools.decode.endpoints.0.url: ...`): never a `TypeError`,
`KeyError`, `RecursionError` or another traceback from deeper in. Only a file that is not a
mapping at all, or not YAML, may carry an issue without a field path.

`PDORCH_FUZZ=1` runs the long campaign (benchmarks/results/reliability.md).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscale.policy import PolicyError, parse_policy
from pdorch.config.fleet import FleetConfigError, parse_fleet_config
from pools.yaml_errors import ConfigFileError, read_yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"
FLEETS = sorted(EXAMPLES.glob("fleet-*.yaml"))
POLICIES = sorted(EXAMPLES.glob("slo-policy*.yaml"))
# per test, not a global profile: several fuzz modules share one session
fuzz = settings(
    max_examples=1_000 if os.environ.get("PDORCH_FUZZ") else 60,
    deadline=None,
    database=None,  # no .hypothesis/ in the tree; a failure prints its example
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _parse_fleet(data: Any) -> None:
    parse_fleet_config(data, base_dir=EXAMPLES, source="fuzz")


def _parse_policy(data: Any) -> None:
    parse_policy(data, base_dir=EXAMPLES, source="fuzz")


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(data, dict):
        for key, value in data.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out += _paths(value, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, files: list[Path]) -> Any:
    data = copy.deepcopy(yaml.safe_load(draw(st.sampled_from(files)).read_text()))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = [p for p in _paths(data) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["set", "drop", "extra"]))
        if action == "set":
            parent[path[-1]] = draw(values)
        elif action == "drop":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(values)
    return data


def _check(error: ConfigFileError) -> None:
    assert error.issues, error
    for issue in error.issues:
        assert issue.path or "mapping" in issue.message or issue.message.startswith("YAML"), issue


def _run(parse: Any, error: type[ConfigFileError], data: Any) -> None:
    try:
        parse(data)
    except error as err:
        _check(err)


def test_the_examples_are_valid() -> None:
    assert FLEETS and POLICIES
    for path in FLEETS:
        _parse_fleet(yaml.safe_load(path.read_text()))
    for path in POLICIES:
        _parse_policy(yaml.safe_load(path.read_text()))


@fuzz
@given(st.text(max_size=200))
def test_any_text_is_loaded_or_refused_with_the_loaders_error(text: str) -> None:
    for parse, error in ((_parse_fleet, FleetConfigError), (_parse_policy, PolicyError)):
        try:
            data, _lines = read_yaml(text, error, "fuzz")
        except error as err:
            _check(err)
            continue
        _run(parse, error, data)


@fuzz
@given(values)
def test_any_data_is_loaded_or_refused_naming_a_field(data: Any) -> None:
    _run(_parse_fleet, FleetConfigError, data)
    _run(_parse_policy, PolicyError, data)


@fuzz
@given(mutated(FLEETS))
def test_mutated_fleet_files_name_the_bad_field(data: Any) -> None:
    _run(_parse_fleet, FleetConfigError, data)
    # the same through YAML text, so the line map walks the mutated tree too
    text = yaml.safe_dump(data)
    try:
        again, lines = read_yaml(text, FleetConfigError, "fuzz")
        parse_fleet_config(again, base_dir=EXAMPLES, source="fuzz", lines=lines)
    except FleetConfigError as err:
        _check(err)


@fuzz
@given(mutated(POLICIES))
def test_mutated_slo_policies_name_the_bad_field(data: Any) -> None:
    _run(_parse_policy, PolicyError, data)


def test_keys_that_would_vanish_are_quoted() -> None:
    # found by the fuzzer: `{"": null}` gave an issue with no field path at all
    try:
        _parse_fleet({"": None, "served_model_name": "m", "pools": {"decode": {}}})
    except FleetConfigError as err:
        assert any(issue.path == '""' for issue in err.issues), err.issues
    else:
        raise AssertionError("an unknown empty key was accepted")
