"""The autoscaling report: files written, ratios as computed by hand, optional planners absent."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from benchmarks.autoscale_sim.report import render_report, summary_table


def _planner(gpu_hours: float, both: float, ready: list[int], ttc: list[float]) -> dict[str, Any]:
    att = {"both": both, "ttft": min(1.0, both + 0.005), "itl": min(1.0, both + 0.002)}
    timeline = [
        {
            "t_s": 30.0 * i,
            "arrival_rps": 5.0 + i,
            "ttft_p90_s": 0.5 + 0.3 * i,
            "itl_p90_s": 0.02 + 0.005 * i,
            "prefill": {"ready": r, "pending": 1 if i == 1 else 0, "draining": 0},
            "decode": {"ready": r + 1, "pending": 0, "draining": 1 if i == 3 else 0},
        }
        for i, r in enumerate(ready)
    ]
    return {
        "attainment": att,
        "attainment_p90": {k: min(1.0, v + 0.003) for k, v in att.items()},
        "attainment_loose": {k: 1.0 for k in att},
        "per_minute": [
            {"t_s": 0.0, "requests": 300, "attainment_both": both},
            {"t_s": 60.0, "requests": 320, "attainment_both": both - 0.04},
            {"t_s": 120.0, "requests": 0, "attainment_both": 0.0},  # empty minute: not "worst"
        ],
        "gpu_hours": gpu_hours,
        "lost": 0,
        "requests": 620,
        "direction_changes": {"prefill": 2, "decode": 1},
        "events": [
            {"t_s": 30.0, "pool": "prefill", "from": 2, "to": 3, "reason": "ttft", "kind": "up"},
            {"t_s": 90.0, "pool": "decode", "from": 4, "to": 3, "reason": "slack", "kind": "down"},
        ],
        "timeline": timeline,
        "time_to_capacity_s": ttc,
    }


RUN: dict[str, Any] = {
    "command": "pdorch bench autoscale --trace t.csv --trace-format azure --planners ...",
    "settings": {
        "rate_scale": 2.0,
        "slo": {"ttft_ms": {"target": 2000.0}, "itl_ms": {"target": 50.0}, "attainment": 0.99},
    },
    "planners": {
        "pdorch": _planner(4.6, 0.995, [2, 3, 4, 3], [4.0, 8.0, 30.0]),
        "oracle": _planner(4.0, 0.999, [2, 2, 3, 2], []),
        "static-peak": _planner(8.0, 0.998, [4, 4, 4, 4], []),
    },
}


def test_summary_ratios_by_hand() -> None:
    rows = {r["planner"]: r for r in summary_table(RUN)}
    assert list(rows) == ["pdorch", "oracle", "static-peak"]
    assert rows["pdorch"]["vs_oracle"] == pytest.approx(4.6 / 4.0)  # 1.150
    assert rows["pdorch"]["vs_static_peak"] == pytest.approx(4.6 / 8.0)  # 0.575
    assert rows["oracle"]["vs_oracle"] == pytest.approx(1.0)
    assert rows["pdorch"]["time_to_capacity_median_s"] == 8.0
    assert rows["pdorch"]["time_to_capacity_max_s"] == 30.0
    assert rows["oracle"]["time_to_capacity_median_s"] is None
    assert rows["pdorch"]["worst_minute_attainment"] == pytest.approx(0.955)
    assert rows["pdorch"]["worst_minute_t_s"] == 60.0
    assert rows["pdorch"]["scale_events"] == 2


def test_render_writes_report_and_pngs(tmp_path: Path) -> None:
    render_report(RUN, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert RUN["command"] in md
    pdorch_row = next(line for line in md.splitlines() if line.startswith("| `pdorch`"))
    assert "| 1.150 |" in pdorch_row and "| 0.575 |" in pdorch_row
    assert "99.50 / 100.00 / 99.70" in pdorch_row
    assert "| 2 / 1 |" in pdorch_row and "8.0 / 30.0" in pdorch_row
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == [
        "gpu_hours_vs_attainment.png",
        "per_minute_attainment.png",
        "replicas_oracle.png",
        "replicas_pdorch.png",
        "replicas_static-peak.png",
    ]
    for png in pngs:
        assert f"]({png})" in md
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "SLO: TTFT ≤ 2000 ms and ITL ≤ 50 ms" in md


@pytest.mark.parametrize("missing", [["oracle"], ["static-peak"], ["oracle", "static-peak"]])
def test_missing_optional_planners(tmp_path: Path, missing: list[str]) -> None:
    run = copy.deepcopy(RUN)
    for name in missing:
        del run["planners"][name]
    del run["settings"]["slo"]  # no SLO in the settings: plots without SLO lines
    run["planners"]["pdorch"]["time_to_capacity_s"] = []
    run["planners"]["pdorch"]["events"] = []
    render_report(run, tmp_path)
    row = summary_table(run)[0]
    assert (row["vs_oracle"] is None) == ("oracle" in missing)
    assert (row["vs_static_peak"] is None) == ("static-peak" in missing)
    md = (tmp_path / "report.md").read_text()
    pdorch_row = next(line for line in md.splitlines() if line.startswith("| `pdorch`"))
    assert "| - / - |" in pdorch_row
    assert (tmp_path / "replicas_pdorch.png").exists()


def test_breach_to_capacity_and_role_moves_sections(tmp_path: Path) -> None:
    run = copy.deepcopy(RUN)
    run["planners"]["pdorch"]["capacity_episodes"] = [
        {
            "pool": "prefill",
            "breach_s": 50.0,
            "capacity_s": 56.0,
            "seconds": 6.0,
            "kind": "moved",
            "by": "p90",
        },
        {
            "pool": "decode",
            "breach_s": 50.0,
            "capacity_s": 150.0,
            "seconds": 100.0,
            "kind": "ready",
            "by": "reactive",
        },
    ]
    run["planners"]["pdorch"]["role_moves"] = [
        {
            "replica": "d1",
            "from": "decode",
            "to": "prefill",
            "asked_s": 50.0,
            "ready_s": 56.0,
            "seconds": 6.0,
        },
        {
            "replica": "d2",
            "from": "decode",
            "to": "prefill",
            "asked_s": 50.0,
            "ready_s": None,
            "seconds": None,
        },
    ]
    render_report(run, tmp_path)
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "| `pdorch` | prefill | 1 | 6.0 | 6.0 | 1 | 50→56 s (moved, p90) |" in md
    assert "| `pdorch` | decode | 1 | 100.0 | 100.0 | 0 | 50→150 s (ready, reactive) |" in md
    # the move that never landed is listed but not timed
    assert "| `pdorch` | 2 | 6.0 | 6.0 | 50 s D→P, 50 s D→P |" in md
    assert "`oracle` | prefill" not in md  # no episodes recorded: no rows
