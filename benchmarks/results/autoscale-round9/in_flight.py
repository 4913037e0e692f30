"""Ground truth for the decode model: per 60 s window of a workload, the sequences in flight
that each model counts against the trace's own count (the round-9 README's table).

    PYTHONPATH=. python benchmarks/results/autoscale-round9/in_flight.py azure|day|moon

Workloads built as `pdorch bench autoscale` builds them (the folders' commands, seed 0).
Columns: the window's rate, the packed batch `B` and its step `D(B)` (timing model, Llama-3.1-8B
on H100, ITL 50 ms), the residence at the packed step `R = T_own + OSL·D(B)`, the mean in
flight by Little's law at the 50 ms target (`m_target`, the default model) and at the packed
step (`m_step`), the trace's own count at each arrival's decode entry (p50 and p99, residences
at `D(B)`: `autoscale/baselines/oracle_decode.py`), the burst quantile `m + z·sqrt(16·m)`,
and the index of dispersion that would make the burst quantile equal the counted p99.
"""

from __future__ import annotations

import bisect
import sys

from autoscale.baselines.oracle_decode import decode_in_flight_quantile
from autoscale.load_window import split_windows
from autoscale.perf_model import TimingPerfModel
from autoscale.sizing import burst_quantile, context_tokens, packed_step_s, uncached_tokens
from benchmarks.autoscale_sim.runner import trace_requests
from benchmarks.workloads import load_workload
from benchmarks.workloads.overlay import overlay
from pools.sim.timing import make_timing

Z = 2.3263478740408408


def requests(name: str) -> list[tuple[float, int, int, float]]:
    if name == "azure":
        w = load_workload(
            "benchmarks/traces/azure/AzureLLMInferenceTrace_conv.csv",
            trace_format="azure", rate_scale=1.0, seed=0, max_requests=2400,
        )  # fmt: skip
        return trace_requests(overlay(w, 14, seed=0), 16)
    if name == "moon":
        w = load_workload(
            "benchmarks/traces/mooncake/conversation_trace.jsonl",
            trace_format="mooncake", rate_scale=1.0, seed=0, max_requests=3000,
        )  # fmt: skip
        return trace_requests(overlay(w, 2, seed=0), 512)
    return trace_requests(load_workload("diurnal", seed=0, duration_s=600, peak_rps=90), 16)


def main(name: str) -> None:
    perf = TimingPerfModel(make_timing("llama-3.1-8b", "h100"))
    reqs = sorted(requests(name))
    arrivals = [r[0] for r in reqs]
    jobs = [
        (a, min(perf.prefill_time_s(uncached_tokens(isl, hit)), 2.0), osl)
        for a, isl, osl, hit in reqs
    ]
    print("| t (s) | rps | B | D(B) ms | R s | m_target | m_step | counted p50 / p99 | "
          "m + z·sqrt(16m) | I fitted |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for w in split_windows(reqs, 60.0):
        ctx = context_tokens(w.mean_isl_tokens, w.mean_osl_tokens)
        b = perf.decode_max_batch(ctx, 0.05)
        d = packed_step_s(perf, b, ctx, 0.05, 1.0)
        t_own = min(perf.prefill_time_s(uncached_tokens(w.mean_isl_tokens, w.prefix_hit_rate)), 2.0)
        m_t = w.arrival_rps * (t_own + w.mean_osl_tokens * 0.05)
        m_s = w.arrival_rps * (t_own + w.mean_osl_tokens * d)
        end = w.start_s + w.duration_s
        p50 = decode_in_flight_quantile(jobs, arrivals, w.start_s, end, d, 0.5, 120.0)
        p99 = decode_in_flight_quantile(jobs, arrivals, w.start_s, end, d, 0.99, 120.0)
        fit = ((p99 - m_s) / Z) ** 2 / m_s if m_s > 0 and p99 > m_s else 1.0
        n = bisect.bisect_left(arrivals, end) - bisect.bisect_left(arrivals, w.start_s)
        if n == 0:
            continue
        print(
            f"| {w.start_s:.0f} | {w.arrival_rps:.1f} | {b} | {d * 1e3:.1f} | "
            f"{t_own + w.mean_osl_tokens * d:.2f} | {m_t:.0f} | {m_s:.0f} | {p50:.0f} / {p99:.0f} | "
            f"{burst_quantile(m_s, 16.0, 0.99):.0f} | {fit:.1f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "azure")
