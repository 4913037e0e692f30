"""One `pdorch bench autoscale` run from several folders' `results.json` (`--merge`).

Why: a long workload's planners are run as separate processes (one `--out` folder each, in
parallel or on different days); the study wants ONE report with every planner's row. Rows
from sibling folders compare like for like only when every planner saw the same arrivals
under the same policy, so the folders' `settings` must be equal in everything but
`planners` (the workload and its parameters, the policy dump, seed, block size, record
period, ...); a difference is an error that names the keys. Two parts are compared as what
they mean, not as written (`comparable`): the policy's `planner:` section (pdorch's own
options: every peer's baseline ignores it, so a pdorch folder run after an option changed still
compares with the peers' folders; the merged settings keep the section of the folder whose
planners read it), the policy dump as the current `SloPolicy` reads it (a field added since a
folder ran, such as Round 7's `perf_model.online_skip_decode_outliers`, takes its default,
which is the behaviour the older code had) and a trace path inside a checkout (compared from
`benchmarks/traces/` on: the same file read from two copies of the repository). The
`policy_file` path is not compared at all: the policy's content, its dump, is.

The merged run dict is what a single run with all those planners would have written, plus
`sources`: one `{"folder", "command", "planners", "wall_s"}` per folder, so the report keeps
each folder's exact command. `wall_s` is the sum of the folders' (the CPU time spent on the
study, not the elapsed time of parallel runs).

Order of the planners: `order` when given (it selects too: a planner not in any folder is an
error), else `CANONICAL` order (the command's default planner list), then the others in folder
order.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autoscale.policy import SloPolicy

__all__ = ["CANONICAL", "MergeError", "comparable", "load_run", "merge_runs"]

CANONICAL = (
    "pdorch",
    "oracle",
    "static-peak",
    "static-mean",
    "hpa-kv-util",
    "dynamo-planner",
    "llmd-slo",
    "aibrix-kpa",
)
"""`pdorch bench autoscale`'s default planners, the report's row order."""


class MergeError(ValueError):
    """Folders that cannot be one run (the message says which and why)."""


def load_run(folder: Path) -> dict[str, Any]:
    """The run dict in `folder/results.json`."""
    path = folder / "results.json"
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MergeError(
            f"{folder}: no results.json (not a `bench autoscale --out` folder)"
        ) from None
    except json.JSONDecodeError as e:
        raise MergeError(f"{path}: not JSON ({e})") from None
    if not isinstance(run, dict) or not isinstance(run.get("planners"), dict):
        raise MergeError(f"{path}: no planners (not a `bench autoscale` results.json)")
    if "sources" in run:
        raise MergeError(f"{path}: already a merged run; merge its source folders instead")
    return run


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


TRACES_DIR = "benchmarks/traces/"
PDORCH_PREFIX = "pdorch"  # the planners that read the policy's `planner:` section


def _repo_relative(value: Any) -> Any:
    """`value` with every string path into a checkout's `benchmarks/traces/` cut to start there."""
    if isinstance(value, str) and TRACES_DIR in value:
        return value[value.index(TRACES_DIR) :]
    if isinstance(value, dict):
        return {k: _repo_relative(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_repo_relative(v) for v in value]
    return value


def comparable(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings as the merge compares them (module docstring): no `planners`, no
    `policy.planner`, no `policy_file` (where the policy was read from: its content, the
    `policy` dump, is what is compared), trace paths from `benchmarks/traces/` on."""
    out = {k: v for k, v in settings.items() if k not in ("planners", "policy_file")}
    policy = out.get("policy")
    if isinstance(policy, dict):
        # a dump this code cannot read is compared as written
        with contextlib.suppress(ValidationError):
            policy = SloPolicy.model_validate(policy).model_dump(mode="json")
        out["policy"] = {k: v for k, v in policy.items() if k != "planner"}
    relative: dict[str, Any] = _repo_relative(out)
    return relative


def _settings_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    a, b = comparable(a), comparable(b)
    keys = sorted(set(a) | set(b))
    return [f"{k}: {_short(a.get(k))} vs {_short(b.get(k))}" for k in keys if a.get(k) != b.get(k)]


def _planner_section_of(sources: list[tuple[Path, dict[str, Any]]]) -> Any:
    """The policy's `planner:` section of the first folder with a pdorch planner (None: none)."""
    for _, run in sources:
        if any(n.startswith(PDORCH_PREFIX) for n in run["planners"]):
            policy = run.get("settings", {}).get("policy")
            return policy.get("planner") if isinstance(policy, dict) else None
    return None


def _ordered(names: list[str], order: list[str] | None) -> list[str]:
    if order is not None:
        missing = [n for n in order if n not in names]
        if missing:
            raise MergeError(
                f"planner(s) {', '.join(missing)} in no folder; the folders have {', '.join(names)}"
            )
        return list(order)
    known = [n for n in CANONICAL if n in names]
    return known + [n for n in names if n not in known]


def merge_runs(
    sources: list[tuple[Path, dict[str, Any]]], command: str, order: list[str] | None = None
) -> dict[str, Any]:
    """The merged run dict of `(folder, run)` pairs (module docstring)."""
    if not sources:
        raise MergeError("no folders to merge")
    first_dir, first = sources[0]
    settings = first.get("settings", {})
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    for folder, run in sources:
        diffs = _settings_differences(settings, run.get("settings", {}))
        if diffs:
            raise MergeError(
                f"{folder} ran other settings than {first_dir}, so its rows would not compare: "
                + "; ".join(diffs)
            )
        for name, result in run["planners"].items():
            if name in found:
                raise MergeError(f"planner {name} is in both {found[name][0]} and {folder}")
            found[name] = (folder, result)
    names = _ordered(list(found), order)
    merged_settings = {**settings, "planners": names}
    section = _planner_section_of(sources)
    policy = merged_settings.get("policy")
    if section is not None and isinstance(policy, dict):
        merged_settings["policy"] = {**policy, "planner": section}
    return {
        "command": command,
        "settings": merged_settings,
        "planners": {n: found[n][1] for n in names},
        "wall_s": sum(float(run.get("wall_s", 0.0)) for _, run in sources),
        "sources": [
            {
                "folder": str(folder),
                "command": run.get("command", ""),
                "planners": [n for n in run["planners"] if n in names],
                "wall_s": run.get("wall_s"),
                "planner_options": (run.get("settings", {}).get("policy") or {}).get("planner"),
            }
            for folder, run in sources
            if any(n in names for n in run["planners"])
        ],
    }
