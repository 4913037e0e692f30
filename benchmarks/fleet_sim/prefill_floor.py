"""The TTFT floor no router can beat on a fleet: each request's prefill time *alone* on an idle
replica (`TimingModel.prefill_time(prompt, cached)`: chunked, attention included, no queue, no
decode batch beside it, no KV transfer), with the cache hits a run got, with the pooled-LRU
bound's hits and with the infinite oracle's; its percentiles against the run's TTFT.

    python -m benchmarks.fleet_sim.prefill_floor --fleet 16C --rate-scale 3 --policy token_load

(Mooncake conversation trace, `--block-size 512`, H200, as `sim-mooncake-*`.) Used by the
issue-15 late-binding study (benchmarks/results/sim-late-binding/README.md): when the p95 of the
prefill alone with the pooled-LRU hits is above a goal, scheduling cannot reach that goal.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.fleet_sim.fleet import FleetSpec
from benchmarks.fleet_sim.simulator import SimConfig, run_simulation
from benchmarks.workloads.traces import load_mooncake
from pools.sim.timing import make_timing

TRACE = Path("benchmarks/traces/mooncake/conversation_trace.jsonl")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleet", default="16C")
    ap.add_argument("--rate-scale", type=float, default=3.0)
    ap.add_argument("--policy", default="token_load")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--max-requests", type=int, default=None)
    args = ap.parse_args()
    wl = load_mooncake(TRACE, rate_scale=args.rate_scale, max_requests=args.max_requests)
    config = SimConfig(
        FleetSpec.parse(args.fleet), policy=args.policy, gpu=args.gpu, block_size=512
    )
    result = run_simulation(wl, config)
    timing = make_timing(config.model, args.gpu)
    recs = [r for r in result.requests if r.first_token is not None]
    columns = {
        "ttft": [r.first_token - r.arrival for r in recs if r.first_token is not None],
        "alone_hit": [timing.prefill_time(r.prompt_tokens, r.hit_tokens) for r in recs],
        "alone_pooled_lru": [timing.prefill_time(r.prompt_tokens, r.lru_hit_tokens) for r in recs],
        "alone_oracle": [timing.prefill_time(r.prompt_tokens, r.oracle_hit_tokens) for r in recs],
    }
    out: dict[str, object] = {"fleet": args.fleet, "rate_scale": args.rate_scale}
    out["policy"] = args.policy
    for name, values in columns.items():
        arr = np.asarray(values) * 1e3
        out[name] = {f"p{q:g}_ms": round(float(np.percentile(arr, q)), 1) for q in (95, 99, 99.9)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
