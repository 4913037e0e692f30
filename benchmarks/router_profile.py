"""Where a routing decision's time goes: cProfile over `pdorch bench router`'s decision loop.

Same populated state and prompts as the bench (`benchmarks.router_bench.setup_decisions`), the
same five steps per decision (block keys, index match, snapshots, `token_load` pick, P/D
decision), run under `cProfile` with the collector as the bench sets it; prints the top
functions by own time (tottime) as a markdown table, per configuration:

    python -m benchmarks.router_profile 8192x256 1024x1024

The profiler's per-call overhead inflates small functions, so read the table for *where* the
time goes and how calls scale with replicas, and the bench for how much it is.
"""

from __future__ import annotations

import cProfile
import gc
import pstats
import sys

from benchmarks.router_bench import decide_once, setup_decisions
from pdorch.app.gc_tuning import GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD
from router.pd_decision import PdDecisionParams
from router.policies.config import build_policy


def profile_table(prompt_tokens: int, replicas: int, iterations: int = 200, top: int = 15) -> str:
    """The markdown top-`top` table (by own time) of `iterations` decisions."""
    setup = setup_decisions(prompt_tokens, replicas, iterations)
    policy = build_policy({"name": "token_load"})
    params = PdDecisionParams()
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)
    profiler = cProfile.Profile()
    try:
        profiler.enable()
        for i, tokens in enumerate(setup.prompts):
            decide_once(setup, policy, params, tokens, i)
        profiler.disable()
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    stats = pstats.Stats(profiler)
    rows = sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda item: item[1][2],
        reverse=True,
    )
    total = sum(v[2] for _, v in rows)
    lines = [
        f"### {prompt_tokens} tokens x {replicas} replicas ({iterations} decisions, "
        f"profiled total {total / iterations * 1e6:,.0f} µs/decision)",
        "",
        "| function | calls/decision | own µs/decision | share |",
        "|---|---:|---:|---:|",
    ]
    for (path, line, name), (_, ncalls, tottime, _cum, _callers) in rows[:top]:
        where = f"{path.rsplit('/', 2)[-2:][-1]}:{line} {name}" if line else name
        lines.append(
            f"| `{where}` | {ncalls / iterations:,.1f} | {tottime / iterations * 1e6:,.1f} | "
            f"{tottime / total:.1%} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    for config in argv or ["8192x256", "1024x1024"]:
        tokens, replicas = (int(x) for x in config.split("x"))
        sys.stdout.write(profile_table(tokens, replicas) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
