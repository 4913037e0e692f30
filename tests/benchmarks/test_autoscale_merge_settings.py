"""`bench autoscale --merge`: which settings differences keep folders apart (pure dicts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.autoscale_sim.merge import MergeError, comparable, merge_runs


def run(planner: str, *, band: float = 0.0, trace: str = "/a/benchmarks/traces/x.csv") -> Any:
    settings = {
        "workload": "diurnal",
        "workload_meta": {"params": {"duration_s": 600.0, "trace": trace}},
        "policy": {"slo": {"ttft_ms": 2000}, "planner": {"down_band": band}},
        "planners": [planner],
    }
    return {"command": f"bench {planner}", "settings": settings, "planners": {planner: {}}}


def test_pdorchs_own_options_and_the_checkout_of_a_trace_do_not_keep_folders_apart() -> None:
    peers = run("llmd-slo", trace="/tmp/frozen/benchmarks/traces/x.csv")
    mine = run("pdorch", band=0.1, trace="/tmp/other/benchmarks/traces/x.csv")
    assert comparable(peers["settings"]) == comparable(mine["settings"])
    # a policy read from another file with the same content (its dump) compares equal too
    mine["settings"]["policy_file"] = "/tmp/sweep/policy-rt6.yaml"
    peers["settings"]["policy_file"] = "deploy/examples/slo-policy.yaml"
    assert comparable(peers["settings"]) == comparable(mine["settings"])
    merged = merge_runs([(Path("p"), peers), (Path("m"), mine)], "merge")
    assert list(merged["planners"]) == ["pdorch", "llmd-slo"]
    # the merged settings keep the options of the folder whose planner reads them
    assert merged["settings"]["policy"]["planner"] == {"down_band": 0.1}
    assert [s["planner_options"] for s in merged["sources"]] == [
        {"down_band": 0.0},
        {"down_band": 0.1},
    ]


def test_every_other_policy_or_trace_difference_still_refuses() -> None:
    a, b = run("pdorch"), run("oracle")
    b["settings"]["policy"]["slo"] = {"ttft_ms": 1000}
    with pytest.raises(MergeError, match="policy"):
        merge_runs([(Path("a"), a), (Path("b"), b)], "merge")
    c = run("oracle", trace="/a/benchmarks/traces/y.csv")
    with pytest.raises(MergeError, match="workload_meta"):
        merge_runs([(Path("a"), a), (Path("c"), c)], "merge")


def test_a_policy_field_added_since_a_folder_ran_compares_at_its_default() -> None:
    old, new = run("oracle"), run("pdorch")
    for r in (old, new):
        r["settings"]["policy"] = {"gpu": "h100"}
    new["settings"]["policy"]["perf_model"] = {"online_skip_decode_outliers": False}
    assert comparable(old["settings"]) == comparable(new["settings"])
    new["settings"]["policy"]["perf_model"] = {"online_skip_decode_outliers": True}
    assert comparable(old["settings"]) != comparable(new["settings"])
