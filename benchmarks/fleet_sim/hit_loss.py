"""Where a run's prefix hits go missing against the pooled-LRU bound (issue 15, hit rate).

For every request, at its arrival (before routing), the router's KV index gives the longest
cached prefix on *any* replica (`KvIndex.match`); with the request's engine-counted hit and the
pooled-LRU bound's hit (`RequestRecord.lru_hit_tokens`) the bound's missing tokens split into

    lost          = max(0, lru_hit - hit)                         what the bound had and we missed
    routed_away   = max(0, min(fleet_max, lru_hit) - hit)         another replica held it
    not_in_fleet  = lost - routed_away                            no replica held it: evicted
                                                                  (partitioned LRUs, duplicates)

plus the duplication of the fleet's caches at the end (index entries / distinct block keys:
1.0 means every cached block is on one replica only).

    python -m benchmarks.fleet_sim.hit_loss --fleet 16C --rate-scale 3 --policy token_load

(Mooncake conversation trace, `--block-size 512`, H200, as `sim-mooncake-*`.) Accounting only:
the wrapper reads the index before the request is routed and changes nothing.
"""

from __future__ import annotations

import json

from benchmarks.fleet_sim.mooncake_study import study_cell, study_parser
from benchmarks.fleet_sim.records import RequestRecord
from benchmarks.fleet_sim.reference_caches import ReferenceCaches
from benchmarks.fleet_sim.simulator import FleetSimulator


class _Watching(ReferenceCaches):
    """The reference caches, also noting the fleet's longest cached prefix of each request at
    its arrival (the simulator calls `observe` before routing it)."""

    def __init__(self, sim: FleetSimulator, block_size: int, lru_capacity_blocks: int) -> None:
        super().__init__(block_size, lru_capacity_blocks)
        self.sim = sim
        self.fleet_max: dict[int, int] = {}  # record number (1-based) -> tokens

    def observe(
        self, prompt_keys: list[int], all_ids: list[int], prompt_tokens: int
    ) -> tuple[int, int]:
        depth = max(self.sim.index.match(prompt_keys).values(), default=0)
        usable = min(depth, (prompt_tokens - 1) // self.block_size) * self.block_size
        self.fleet_max[len(self.sim.all_records)] = usable
        return super().observe(prompt_keys, all_ids, prompt_tokens)


def measure(
    fleet: str, rate_scale: float, policy: str, max_requests: int | None
) -> dict[str, object]:
    """One run's hit-loss split (module docstring)."""
    wl, config = study_cell(fleet, rate_scale, policy, max_requests)
    sim = FleetSimulator(wl, config)
    bs = config.block_size
    watch = _Watching(sim, bs, sim.references.lru_capacity)
    sim.references = watch
    fleet_max = watch.fleet_max
    result = sim.run()
    recs: list[RequestRecord] = result.requests
    prompt = lost = away = hit = bound = 0
    for i, r in enumerate(sim.all_records):
        best = fleet_max.get(i + 1, 0)
        prompt += r.prompt_tokens
        hit += r.hit_tokens
        bound += r.lru_hit_tokens
        missed = max(0, r.lru_hit_tokens - r.hit_tokens)
        lost += missed
        away += min(missed, max(0, min(best, r.lru_hit_tokens) - r.hit_tokens))
    stats = sim.index.stats()
    entries = sum(stats.blocks_per_replica.values())
    return {
        "fleet": fleet,
        "rate_scale": rate_scale,
        "policy": policy,
        "requests": len(recs),
        "hit_rate": round(hit / prompt, 4),
        "pooled_lru_hit_rate": round(bound / prompt, 4),
        "lost_of_prompt": round(lost / prompt, 4),
        "routed_away_of_lost": round(away / lost, 3) if lost else 0.0,
        "not_in_fleet_of_lost": round((lost - away) / lost, 3) if lost else 0.0,
        "duplication_at_end": round(entries / max(1, stats.distinct_keys), 3),
    }


def main() -> None:
    args = study_parser(__doc__, fleet="16C").parse_args()
    print(json.dumps(measure(args.fleet, args.rate_scale, args.policy, args.max_requests)))


if __name__ == "__main__":
    main()
