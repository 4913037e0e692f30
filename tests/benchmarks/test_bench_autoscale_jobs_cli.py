"""`pdorch bench autoscale --jobs N` and `--merge DIR,...`: the same run, however it was made.

`--jobs 2` forks worker processes (integration tier by this file's name); its results.json
must equal `--jobs 1`'s in every field but the run's own timings, and folders run apart and
merged must equal the run that had all their planners.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from autoscale.policy import load_policy
from benchmarks.autoscale_sim.same_results import differences, strip_run_fields
from pdorch.cli import app
from tests.data import AZURE_CONVERSATION, REPO, require_file

POLICY = REPO / "deploy" / "examples" / "slo-policy.yaml"
PLANNERS = "pdorch,oracle,static-peak"


def bench(*args: str) -> Any:
    trace = require_file(AZURE_CONVERSATION)
    base = ["bench", "autoscale", "--trace", str(trace), "--trace-format", "azure"]
    base += ["--rate-scale", "3", "--policy", str(POLICY), "--json"]
    return CliRunner().invoke(app, [*base, *args])


def results(folder: Path) -> dict[str, Any]:
    run: dict[str, Any] = json.loads((folder / "results.json").read_text())
    return run


def said(result: Any) -> str:
    """The command's output with rich's error box and line wrapping taken out."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())


def same_run(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Differences but the run's timings, its command and a merge's source list."""
    strip = {k: v for k, v in strip_run_fields(a).items() if k != "sources"}
    return differences(strip, {k: v for k, v in strip_run_fields(b).items() if k != "sources"})


def test_jobs_2_gives_the_same_results_as_jobs_1_and_merge_gives_the_whole_run(
    tmp_path: Path,
) -> None:
    rows = ["--max-requests", "150"]
    one, two = tmp_path / "one", tmp_path / "two"
    r1 = bench(*rows, "--planners", PLANNERS, "--out", str(one))
    r2 = bench(*rows, "--planners", PLANNERS, "--jobs", "2", "--out", str(two))
    assert r1.exit_code == 0, r1.output
    assert r2.exit_code == 0, r2.output
    run1, run2 = results(one), results(two)
    assert list(run2["planners"]) == PLANNERS.split(",")
    assert same_run(run1, run2) == []
    assert run1["planners"]["pdorch"]["events"], "a run with no scale events proves little"
    # the effective policy beside the results, to rerun with after a default changes
    effective = load_policy(one / "policy.yaml").model_dump(mode="json")
    assert effective == run1["settings"]["policy"]
    j1, j2 = json.loads(r1.stdout)["planners"], json.loads(r2.stdout)["planners"]
    for name in j1:
        assert {k: v for k, v in j1[name].items() if k != "sim_cpu_s"} == {
            k: v for k, v in j2[name].items() if k != "sim_cpu_s"
        }

    # the same planners run in two folders, then merged: the single run again, in the
    # canonical order although the folders came the other way round
    a, b, merged = tmp_path / "a", tmp_path / "b", tmp_path / "merged"
    assert bench(*rows, "--planners", "static-peak", "--out", str(a)).exit_code == 0
    assert bench(*rows, "--planners", "pdorch,oracle", "--out", str(b)).exit_code == 0
    m = CliRunner().invoke(
        app, ["bench", "autoscale", "--merge", f"{a},{b}", "--json", "--out", str(merged)]
    )
    assert m.exit_code == 0, m.output
    run_m = results(merged)
    assert list(run_m["planners"]) == PLANNERS.split(",")
    assert same_run(run1, run_m) == []
    assert set(json.loads(m.stdout)["planners"]) == set(PLANNERS.split(","))
    report = (merged / "report.md").read_text()
    for folder in (a, b):  # each folder's own command stays in the report
        assert results(folder)["command"] in report
    assert (merged / "replicas_static-peak.png").is_file()

    # --planners selects and orders a merge's rows
    pick = ["--merge", str(b), "--merge", str(a), "--planners", "static-peak,pdorch", "--json"]
    sel = CliRunner().invoke(app, ["bench", "autoscale", *pick])
    assert sel.exit_code == 0, sel.output
    assert list(json.loads(sel.stdout)["planners"]) == ["static-peak", "pdorch"]


def test_merge_refuses_folders_of_other_settings_or_the_same_planner_twice(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert (
        bench("--max-requests", "40", "--planners", "static-peak", "--out", str(a)).exit_code == 0
    )
    assert (
        bench("--max-requests", "60", "--planners", "static-mean", "--out", str(b)).exit_code == 0
    )
    other = CliRunner().invoke(app, ["bench", "autoscale", "--merge", f"{a},{b}"])
    assert other.exit_code != 0
    assert "max_requests: 40 vs 60" in said(other) and "other settings" in said(other)
    twice = CliRunner().invoke(app, ["bench", "autoscale", "--merge", f"{a},{a}"])
    assert twice.exit_code != 0 and "static-peak is in both" in said(twice)
    empty = CliRunner().invoke(app, ["bench", "autoscale", "--merge", str(tmp_path)])
    assert empty.exit_code != 0 and "no results.json" in said(empty)
    both = CliRunner().invoke(app, ["bench", "autoscale", "--merge", str(a), "--workload", "x"])
    assert both.exit_code != 0 and "no --workload" in said(both)
