"""`pdorch bench autoscale --out DIR` writes `DIR/policy.yaml`, the effective policy: every
field with the value the run had, so a study reproduces after a default changes."""

from __future__ import annotations

from pathlib import Path

import yaml

from autoscale.policy import load_policy
from pdorch.cli.bench_autoscale_output import write_effective_policy

# a policy that sets one field and leaves the rest to the defaults of the day
SPARSE = "planner:\n  reversal_ticks: 3\n"


def test_the_written_policy_loads_back_to_the_run_policy_with_every_default_set(
    tmp_path: Path,
) -> None:
    policy = load_policy(SPARSE)
    dumped = policy.model_dump(mode="json")
    run = {"command": "pdorch bench autoscale\n  --planners pdorch", "settings": {"policy": dumped}}
    write_effective_policy(run, tmp_path)
    text = (tmp_path / "policy.yaml").read_text(encoding="utf-8")
    assert "# Command: pdorch bench autoscale --planners pdorch\n" in text
    assert load_policy(tmp_path / "policy.yaml").model_dump(mode="json") == dumped
    # the field it set and those it left to their defaults, each with the value it had
    written = yaml.safe_load(text)
    assert written["planner"]["reversal_ticks"] == 3
    assert written["planner"]["headroom"] == policy.planner.headroom
    assert written["slo"] == dumped["slo"]


def test_a_run_without_a_policy_writes_none(tmp_path: Path) -> None:
    write_effective_policy({"command": "x", "settings": {}}, tmp_path)
    assert not (tmp_path / "policy.yaml").exists()
