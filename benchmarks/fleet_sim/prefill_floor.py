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

import json

import numpy as np

from benchmarks.fleet_sim.mooncake_study import study_cell, study_parser
from benchmarks.fleet_sim.simulator import run_simulation
from pools.sim.timing import make_timing


def main() -> None:
    ap = study_parser(__doc__, fleet="16C")
    ap.add_argument("--gpu", default="h200")
    args = ap.parse_args()
    wl, config = study_cell(
        args.fleet, args.rate_scale, args.policy, args.max_requests, gpu=args.gpu
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
