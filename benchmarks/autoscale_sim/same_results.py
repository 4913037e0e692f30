"""Check that two `pdorch bench autoscale` results.json files agree on every result.

Why: speed work on the fleet simulator, the engine sim it drives and the router must not
change any result (issue 11's speed item). Two runs of the same command are compared field
by field, exactly (floats included: the simulator is deterministic), except the fields that
measure the run rather than the fleet:

- top level `wall_s` and `command` (the output folder differs between the two runs);
- per planner `sim_cpu_s`, `sim_wall_s`, `plan_cpu_s`.

    python -m benchmarks.autoscale_sim.same_results OLD/results.json NEW/results.json

prints every differing path (at most 20) and exits 1, or prints "identical" and exits 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RUN_FIELDS = frozenset({"wall_s", "command"})
PLANNER_RUN_FIELDS = frozenset({"sim_cpu_s", "sim_wall_s", "plan_cpu_s"})


def strip_run_fields(results: dict[str, object]) -> dict[str, object]:
    """`results` without the fields that measure the run (module docstring)."""
    out = {k: v for k, v in results.items() if k not in RUN_FIELDS}
    planners = out.get("planners")
    if isinstance(planners, dict):
        out["planners"] = {
            name: (
                {k: v for k, v in p.items() if k not in PLANNER_RUN_FIELDS}
                if isinstance(p, dict)
                else p
            )
            for name, p in planners.items()
        }
    settings = out.get("settings")
    if isinstance(settings, dict) and "out" in settings:
        out["settings"] = {k: v for k, v in settings.items() if k != "out"}
    return out


def differences(a: object, b: object, path: str = "") -> list[str]:
    """Paths where `a` and `b` differ (exact equality, floats included)."""
    if isinstance(a, dict) and isinstance(b, dict):
        diffs: list[str] = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                diffs.append(f"{path}/{k}: only in {'new' if k in b else 'old'}")
            else:
                diffs.extend(differences(a[k], b[k], f"{path}/{k}"))
        return diffs
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        diffs = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            diffs.extend(differences(x, y, f"{path}[{i}]"))
        return diffs
    return [] if a == b and type(a) is type(b) else [f"{path}: {a!r} != {b!r}"]


def compare_files(old: Path, new: Path) -> list[str]:
    a = json.loads(old.read_text())
    b = json.loads(new.read_text())
    return differences(strip_run_fields(a), strip_run_fields(b))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m benchmarks.autoscale_sim.same_results OLD.json NEW.json")
        return 2
    diffs = compare_files(Path(argv[0]), Path(argv[1]))
    if diffs:
        for d in diffs[:20]:
            print(d)
        print(f"{len(diffs)} difference(s)")
        return 1
    print("identical")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
