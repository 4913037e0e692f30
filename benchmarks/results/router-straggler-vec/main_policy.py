"""Run main's `pdorch bench router` (no `--policy` flag there) with a `token_load` override.

Usage: `PYTHONPATH=/work/main python main_policy.py '{"remaining_decode": true}' <bench args>`:
main's bench builds `{"name": "token_load"}`; this swaps in the same profile with the given
params (the shipped profile's own params stay, as `--policy token_load@...` does on route-7).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import benchmarks.router_bench as bench
from pdorch.cli import main

params = json.loads(sys.argv[1])
real = bench.__dict__["build_policy"]  # main's module-level import, replaced below


def _override(config: Any, *args: Any, **kwargs: Any) -> Any:
    return real({"name": "token_load", "params": params}, *args, **kwargs)


setattr(bench, "build_policy", _override)  # noqa: B010 (not an export: a run-time swap)
sys.argv = ["pdorch", "bench", "router", *sys.argv[2:]]
main()
