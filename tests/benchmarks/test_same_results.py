"""`benchmarks.autoscale_sim.same_results`: the identity check of two what-if runs."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.autoscale_sim.same_results import compare_files, main


def _results(gpu_hours: float, cpu_s: float, out: str) -> dict[str, object]:
    return {
        "command": f"pdorch bench autoscale --out {out}",
        "settings": {"seed": 0},
        "planners": {
            "oracle": {"gpu_hours": gpu_hours, "events": [1, 2], "sim_cpu_s": cpu_s},
        },
        "wall_s": cpu_s * 2,
    }


def test_run_fields_are_ignored_and_any_result_differs(tmp_path: Path) -> None:
    old, new, other = tmp_path / "old.json", tmp_path / "new.json", tmp_path / "other.json"
    old.write_text(json.dumps(_results(0.96, 50.0, "a")))
    new.write_text(json.dumps(_results(0.96, 20.0, "b")))  # faster, another folder: same
    assert compare_files(old, new) == []
    assert main([str(old), str(new)]) == 0
    other.write_text(json.dumps(_results(0.9600000001, 20.0, "b")))  # exact, floats included
    assert compare_files(old, other) == ["/planners/oracle/gpu_hours: 0.96 != 0.9600000001"]
    assert main([str(old), str(other)]) == 1
