"""Turn a live run's per-request results into the metrics object (simulator's names).

Keys (times in ms unless the name ends in `_s`; percentiles are numpy linear interpolation):
`ttft_{p50,p90,p95,p99}_ms`, `itl_{p50,p90,p95,p99}_ms` (over all inter-chunk gaps of all
successful requests), `tpot_{p50,p90,p95,p99}_ms` (per request), `e2e_{p50,p90,p99}_ms`,
`requests_per_s` and `output_tokens_per_s` (successful requests / their output tokens over the
wall time from the first request start to the last request end), `completed`, `errors`,
`cancelled`, `planned`, `wall_s`, `error_samples` (up to 5 distinct messages),
`prompt_tokens_ratio` (server-counted prompt tokens / planned workload tokens: ~1 with a BPE
tokenizer plus chat-template overhead; ~6 with the simulated engine's byte tokenizer), and where the
workload has groups (rl-rollouts): `rollouts_completed`, `rollout_p50_s`, `rollout_p99_s`,
`rollout_max_s` (a group's latency = last end - first start over all its sessions' requests;
only groups whose every planned request succeeded count).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from benchmarks.live.client import RequestResult
from benchmarks.live.runner import LiveRun
from benchmarks.workloads.model import Workload

__all__ = ["summarize"]

_PCTS = (50, 90, 95, 99)


def _pcts(
    prefix: str, values: list[float], scale: float, pcts: tuple[int, ...] = _PCTS
) -> dict[str, float | None]:
    if not values:
        return {f"{prefix}_p{p}_ms": None for p in pcts}
    arr = np.asarray(values, dtype=float) * scale
    return {f"{prefix}_p{p}_ms": float(np.percentile(arr, p)) for p in pcts}


def summarize(run: LiveRun, workload: Workload) -> dict[str, Any]:
    """The metrics object printed by `pdorch bench live --json`."""
    ok = [r for r in run.results if r.ok]
    errors = [r for r in run.results if r.error is not None and not r.cancelled]
    cancelled = [r for r in run.results if r.cancelled]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [x for r in ok for x in r.itl_s]
    tpot = [t for r in ok if (t := r.tpot_s) is not None]
    e2e = [r.end_s - r.start_s for r in ok]
    if run.results:
        span = max(r.end_s for r in run.results) - min(r.start_s for r in run.results)
    else:
        span = 0.0
    out_tokens = sum(r.output_tokens for r in ok)
    out: dict[str, Any] = {
        "workload": workload.name,
        "planned": run.planned_requests,
        "completed": len(ok),
        "errors": len(errors),
        "cancelled": len(cancelled),
        "wall_s": run.wall_s,
        "requests_per_s": len(ok) / span if span > 0 else 0.0,
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / span if span > 0 else 0.0,
        "output_tokens_short": sum(1 for r in ok if r.output_tokens < r.expected_output_tokens),
    }
    counted = [r for r in ok if r.prompt_tokens is not None and r.expected_prompt_tokens > 0]
    out["prompt_tokens_ratio"] = (
        sum(r.prompt_tokens or 0 for r in counted) / sum(r.expected_prompt_tokens for r in counted)
        if counted
        else None
    )
    out.update(_pcts("ttft", ttft, 1e3))
    out.update(_pcts("itl", itl, 1e3))
    out.update(_pcts("tpot", tpot, 1e3))
    out.update(_pcts("e2e", e2e, 1e3, (50, 90, 99)))
    out["error_samples"] = sorted({r.error for r in errors if r.error})[:5]
    out.update(_group_latency(run.results, workload))
    return out


def _group_latency(results: list[RequestResult], workload: Workload) -> dict[str, Any]:
    planned: dict[str, int] = defaultdict(int)
    for s in workload.sessions:
        if s.group is not None:
            planned[s.group] += len(s.turns)
    if not planned:
        return {}
    done: dict[str, list[RequestResult]] = defaultdict(list)
    for r in results:
        if r.group is not None:
            done[r.group].append(r)
    latencies = [
        max(r.end_s for r in rs) - min(r.start_s for r in rs)
        for g, rs in done.items()
        if len(rs) == planned[g] and all(r.ok for r in rs)
    ]
    out: dict[str, Any] = {"rollouts_planned": len(planned), "rollouts_completed": len(latencies)}
    if latencies:
        arr = np.asarray(latencies)
        out["rollout_p50_s"] = float(np.percentile(arr, 50))
        out["rollout_p99_s"] = float(np.percentile(arr, 99))
        out["rollout_max_s"] = float(arr.max())
    else:
        out["rollout_p50_s"] = out["rollout_p99_s"] = out["rollout_max_s"] = None
    return out
