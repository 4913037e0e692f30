"""Where a run's TTFT tail goes: each request's TTFT split into its prefill alone with the
pooled-LRU bound's hits, the hits it lost against that bound, the wait on its prefill replica
(queue + sharing steps with other prefills and decodes), and the time after its prefill leg
(the KV transfer, the decode replica's admission and first step; P/D requests only):

    ttft          = first_token - arrival
    alone_lru     = prefill_time(prompt, lru_hit_tokens)
    lost_hits     = prefill_time(prompt, hit_tokens) - alone_lru
    prefill_wait  = (prefill_end or first_token) - arrival - prefill_time(prompt, hit_tokens)
    after_prefill = first_token - prefill_end            (0 for a request prefilled locally)
    transfer      = kv_transfer_time(transfer_tokens)    (the link alone, part of after_prefill)

For each part, the p95 of `ttft - part` (the tail if that part alone were free, the others as
they were) and the part's mean over the requests whose TTFT is in the p90-p99 band.

    python -m benchmarks.fleet_sim.ttft_parts --fleet 8P8D --rate-scale 3 --policy token_load

(Mooncake conversation trace, `--block-size 512`, H200, as `sim-route-defaults`.)
"""

from __future__ import annotations

import json

import numpy as np

from benchmarks.fleet_sim.mooncake_study import study_cell, study_parser
from benchmarks.fleet_sim.simulator import run_simulation
from pools.sim.timing import make_timing

PARTS = ("alone_lru", "lost_hits", "prefill_wait", "after_prefill", "transfer")


def measure(
    fleet: str, rate_scale: float, policy: str, max_requests: int | None = None
) -> dict[str, object]:
    """The run's TTFT parts (module docstring), in ms."""
    wl, config = study_cell(fleet, rate_scale, policy, max_requests)
    result = run_simulation(wl, config)
    timing = make_timing(config.model, "h200")
    rows: list[tuple[float, ...]] = []
    for r in result.requests:
        if r.first_token is None:
            continue
        alone_hit = timing.prefill_time(r.prompt_tokens, r.hit_tokens)
        alone_lru = timing.prefill_time(r.prompt_tokens, r.lru_hit_tokens)
        end = r.prefill_end if r.prefill_end is not None else r.first_token
        rows.append(
            (
                r.first_token - r.arrival,
                alone_lru,
                alone_hit - alone_lru,
                end - r.arrival - alone_hit,
                r.first_token - end,
                timing.kv_transfer_time(r.transfer_tokens) if r.disaggregated else 0.0,
            )
        )
    table = np.asarray(rows) * 1e3
    ttft = table[:, 0]
    lo, hi = np.percentile(ttft, 90), np.percentile(ttft, 99)
    band = (ttft >= lo) & (ttft <= hi)
    out: dict[str, object] = {"fleet": fleet, "rate_scale": rate_scale, "policy": policy}
    out["requests"] = len(rows)
    out["ttft_p95_ms"] = round(float(np.percentile(ttft, 95)), 1)
    out["p95_without_ms"] = {
        part: round(float(np.percentile(ttft - np.maximum(table[:, k + 1], 0.0), 95)), 1)
        for k, part in enumerate(PARTS)
        if part != "alone_lru"
    }
    out["p90_p99_band_mean_ms"] = {"ttft": round(float(ttft[band].mean()), 1)} | {
        part: round(float(table[band, k + 1].mean()), 1) for k, part in enumerate(PARTS)
    }
    out["p90_p99_band_requests"] = int(band.sum())
    return out


def main() -> None:
    args = study_parser(__doc__, fleet="8P8D").parse_args()
    print(json.dumps(measure(args.fleet, args.rate_scale, args.policy, args.max_requests)))


if __name__ == "__main__":
    main()
