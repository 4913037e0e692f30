"""The proxy bench's rounds and rows (`benchmarks/proxy_bench.py`): one (target, C)'s
measurements summed over its interleaved rounds, the rounds' sizes, the JSON row and the
ratios against `direct` and `vllm-router`. Split from proxy_bench.py (issue 15 code health:
the rounds/targets seam; the driver and the processes stay there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunResult:
    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


@dataclass
class Totals:
    """One (target, C)'s measurements summed over its rounds."""

    run: RunResult = field(default_factory=RunResult)
    client_cpu: float = 0.0
    proxy_cpu: float | None = None
    engines_cpu: float = 0.0
    sources: dict[str, float] = field(default_factory=dict)  # decode prompt tokens by source
    rps_rounds: list[float] = field(default_factory=list)

    def add(
        self,
        run: RunResult,
        client_cpu: float,
        proxy_cpu: float | None,
        engines_cpu: float,
        sources0: dict[str, float],
        sources1: dict[str, float],
    ) -> None:
        self.run.latencies_s += run.latencies_s
        self.run.errors += run.errors
        self.run.wall_s += run.wall_s
        self.rps_rounds.append(round(len(run.latencies_s) / run.wall_s, 1) if run.wall_s else 0.0)
        self.client_cpu += client_cpu
        if proxy_cpu is not None:
            self.proxy_cpu = (self.proxy_cpu or 0.0) + proxy_cpu
        self.engines_cpu += engines_cpu
        for key, value in sources1.items():
            self.sources[key] = self.sources.get(key, 0.0) + value - sources0.get(key, 0.0)


def round_sizes(requests: int, rounds: int) -> list[int]:
    """`requests` split into `rounds` near-equal rounds (the first ones take the remainder);
    never an empty round."""
    rounds = max(1, min(rounds, requests))
    base, extra = divmod(requests, rounds)
    return [base + (1 if i < extra else 0) for i in range(rounds)]


def row(target: str, concurrency: int, totals: Totals) -> dict[str, Any]:
    run = totals.run
    lat = sorted(run.latencies_s)
    ok = len(lat)
    done = max(1, ok + len(run.errors))
    prompt_total = sum(totals.sources.values())
    remote = totals.sources.get("external_kv_transfer", 0.0)

    def per_req_us(cpu: float | None) -> float | None:
        return None if cpu is None else round(cpu / done * 1e6, 1)

    return {
        "target": target,
        "concurrency": concurrency,
        "requests": ok + len(run.errors),
        "ok": ok,
        "errors": len(run.errors),
        "first_error": run.errors[0] if run.errors else None,
        "rps": round(ok / run.wall_s, 1) if run.wall_s > 0 else 0.0,
        "rps_rounds": totals.rps_rounds,
        "p50_ms": round(_percentile(lat, 50) * 1e3, 3),
        "p99_ms": round(_percentile(lat, 99) * 1e3, 3),
        "mean_ms": round(sum(lat) / ok * 1e3, 3) if ok else float("nan"),
        "client_cpu_us_per_req": per_req_us(totals.client_cpu),
        "proxy_cpu_us_per_req": per_req_us(totals.proxy_cpu),
        "engines_cpu_us_per_req": per_req_us(totals.engines_cpu),
        "remote_prefill_frac": round(remote / prompt_total, 3) if prompt_total else None,
    }


def add_comparisons(rows: list[dict[str, Any]]) -> None:
    """Added latency vs `direct` and req/s ratio vs `vllm-router` at the same concurrency."""
    by = {(r["target"], r["concurrency"]): r for r in rows}
    for row in rows:
        direct = by.get(("direct", row["concurrency"]))
        router = by.get(("vllm-router", row["concurrency"]))
        row["added_p50_ms"] = (
            round(row["p50_ms"] - direct["p50_ms"], 3) if direct is not None else None
        )
        row["added_p99_ms"] = (
            round(row["p99_ms"] - direct["p99_ms"], 3) if direct is not None else None
        )
        row["rps_vs_vllm_router"] = (
            round(row["rps"] / router["rps"], 3) if router is not None and router["rps"] else None
        )
