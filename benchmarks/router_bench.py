"""`pdorch bench router`: routing decision latency and KV-event ingestion throughput.

**Decision latency.** For each (prompt tokens, replicas) pair a `KvIndex` is populated through
real `BlockStored` events (the index recomputes pdorch's block keys from their token ids):
replica `r` holds the first `k_r` blocks of a shared base prompt (`k_r` uniform over the
prompt's blocks, so the prefix walk is deep and replicas drop out one by one) plus an unrelated
background chain of 256 blocks; a `TokenLoad` tracker holds a few requests per replica and a
metrics scrape each. Each timed decision is exactly the request path of the router, minus
tokenization (token ids are given):

    keys = index.keys_for(token_ids)                  # xxh3-64 block-key chain (+ ChainMemo)
    overlap = index.overlap(keys)                     # leading cached blocks per replica
    snapshots = columns.build(replicas, overlap, token_load, now)   # router/replica_columns.py
    prefill = token_load_profile.pick(request, snapshots, now)
    pd = decide_pd(request, snapshots, params, now)

The prompt is the base prompt with its last 10% replaced by fresh random tokens every
iteration (a shared system prompt plus a new question). Latency is wall time per decision
(`perf_counter_ns`), reported as p50/p99 in microseconds, the targets' measure. The thread's
CPU time per decision (`thread_time_ns`) is reported beside it: on a shared machine, wall-time
tails include time slices given to other processes, CPU time does not; the load average at the
start is recorded for the same reason. The garbage collector stays on, set as `pdorch serve`
sets it (`pdorch/app/gc_tuning.py`: `gc.freeze()` of the populated index, what a long-running
coordinator's old generation looks like, and a young-generation threshold of 20,000). Each
The candidates are `ReplicaColumns` (arrays, issue 15), built by one `ColumnBuilder` that
rewrites only the rows whose load changed, as the coordinator's pools do; the `snapshots` stage
is that build (before issue 15 it was `build_snapshots`, one object per replica). Each
stage's p50 is reported too (`stage_p50_us`: block_keys, index_match, snapshots,
token_load_pick, pd_decision), so a slow stage is named.

**Index memory.** Per configuration, `tracemalloc` over the populate step (off before timing):
bytes per (replica, block) entry (`index_bytes_per_entry`) and per distinct block key
(`index_bytes_per_key`); the entries are the prefix blocks of every replica plus its 256
background blocks.

**Ingestion.** `benchmarks.router_ingest.measure_ingest_throughput`: vLLM-format msgpack payloads
decoded and applied to a `KvIndex` through the subscriber's frame path (no sockets), in blocks/s.

**Policy.** `policy` (`--policy`) names the prefill profile in `pdorch bench sim`'s syntax
(`benchmarks/fleet_sim/policies.py`), default `token_load` as shipped; e.g.
`token_load@remaining_decode=true` times the straggler-aware term (issue 15).

Targets (issue 5): p99 <= 1 ms at 8k tokens x 64 replicas; >= 200k blocks/s ingestion.
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.fleet_sim.policies import router_config_for
from benchmarks.router_ingest import measure_ingest_throughput
from pdorch.app.gc_tuning import GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD
from router.kv_events import BlockStored, EngineBlockHash
from router.kv_index import KvIndex
from router.pd_decision import PdDecisionParams, decide_pd
from router.plugins.profile import Profile
from router.policies.config import build_policy
from router.replica_columns import ColumnBuilder
from router.replica_state import PolicyDecision, RoutingRequest
from router.token_load import TokenLoad

DEFAULT_PROMPT_TOKENS = (1024, 8192, 32768)
DEFAULT_REPLICAS = (8, 64, 256)
TARGET_P99_US = 1000.0
TARGET_PROMPT_TOKENS = 8192
TARGET_REPLICAS = 64
TARGET_INGEST_BLOCKS_PER_S = 200_000.0
VOCAB = 32_000

Progress = Callable[[str, int], None]
"""Callback: (stage description, units of work just done)."""


@dataclass(frozen=True, slots=True)
class DecisionLatency:
    """Latency of one (prompt tokens, replicas) configuration."""

    prompt_tokens: int
    replicas: int
    p50_us: float
    p99_us: float
    mean_us: float
    cpu_p50_us: float
    cpu_p99_us: float
    iterations: int
    mean_overlap_blocks: float
    stage_p50_us: dict[str, float]
    # index memory (tracemalloc, while populating): bytes per (replica, block) entry and per
    # distinct block key; entries = sum over replicas of blocks held
    index_entries: int = 0
    index_distinct_keys: int = 0
    index_bytes_per_entry: float = 0.0
    index_bytes_per_key: float = 0.0


@dataclass(slots=True)
class RouterBenchResult:
    """Everything `pdorch bench router` reports."""

    decision: list[DecisionLatency] = field(default_factory=list)
    ingest_blocks_per_s: float = 0.0
    ingest_blocks: int = 0
    ingest_seconds: float = 0.0
    block_size: int = 16
    load_average: tuple[float, float, float] = (0.0, 0.0, 0.0)
    policy: str = "token_load"

    def to_json(self) -> dict[str, Any]:
        """The `--json` object: `{"decision": [...], "ingest_blocks_per_s": Z, ...}`."""
        return {
            "decision": [
                {k: (round(v, 2) if isinstance(v, float) else v) for k, v in asdict(d).items()}
                for d in self.decision
            ],
            "ingest_blocks_per_s": round(self.ingest_blocks_per_s, 1),
            "ingest_blocks": self.ingest_blocks,
            "ingest_seconds": round(self.ingest_seconds, 4),
            "block_size": self.block_size,
            "policy": self.policy,
            "load_average_1_5_15m": [round(x, 2) for x in self.load_average],
            "targets": {
                "decision_p99_us": TARGET_P99_US,
                "decision_at": {"prompt_tokens": TARGET_PROMPT_TOKENS, "replicas": TARGET_REPLICAS},
                "ingest_blocks_per_s": TARGET_INGEST_BLOCKS_PER_S,
            },
            "targets_met": self.targets_met(),
        }

    def targets_met(self) -> dict[str, bool | None]:
        """Whether each target was met (None: that configuration was not measured)."""
        at = [
            d
            for d in self.decision
            if d.prompt_tokens == TARGET_PROMPT_TOKENS and d.replicas == TARGET_REPLICAS
        ]
        return {
            "decision_p99": at[0].p99_us <= TARGET_P99_US if at else None,
            "ingest": (
                self.ingest_blocks_per_s >= TARGET_INGEST_BLOCKS_PER_S
                if self.ingest_blocks
                else None
            ),
        }


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of already sorted values."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), round(q / 100.0 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def _populate(
    index: KvIndex,
    load: TokenLoad,
    replica_ids: Sequence[str],
    base: list[int],
    rng: random.Random,
    now: float,
) -> None:
    bs = index.block_size
    n_blocks = len(base) // bs
    next_hash = 1
    for rid in replica_ids:
        depth = rng.randint(0, n_blocks)
        if depth:
            hashes: list[EngineBlockHash] = list(range(next_hash, next_hash + depth))
            next_hash += depth
            index.apply(rid, [BlockStored(hashes, None, base[: depth * bs], bs, medium="GPU")])
        background = [rng.randrange(VOCAB) for _ in range(256 * bs)]
        hashes = list(range(next_hash, next_hash + 256))
        next_hash += 256
        index.apply(rid, [BlockStored(hashes, None, background, bs, medium="GPU")])
        for j in range(rng.randrange(0, 6)):
            prompt = rng.randrange(256, 8192)
            load.on_admitted(
                f"{rid}-bg{j}",
                rid,
                now,
                prompt_tokens=prompt,
                uncached_tokens=rng.randrange(0, prompt),
                block_size=bs,
            )
            if rng.random() < 0.5:
                load.on_prefill_done(f"{rid}-bg{j}", rid, now)
        load.observe_metrics(
            rid,
            now - 1.0,
            num_running=rng.randrange(0, 8),
            num_waiting=rng.randrange(0, 4),
            kv_usage=rng.random() * 0.8,
            kv_capacity_blocks=30_000,
        )


@dataclass(slots=True)
class BenchSetup:
    """One configuration's populated state and its prompts (shared with the profiler,
    `benchmarks/router_profile.py`)."""

    index: KvIndex
    load: TokenLoad
    replica_ids: list[str]
    prompts: list[list[int]]
    now: float
    index_bytes: int
    entries: int
    distinct_keys: int
    columns: ColumnBuilder = field(default_factory=ColumnBuilder)


def setup_decisions(
    prompt_tokens: int, replicas: int, iterations: int, block_size: int = 16, seed: int = 0
) -> BenchSetup:
    """Populate the index and token load of one configuration; draw its prompts."""
    rng = random.Random(seed * 1_000_003 + prompt_tokens * 7 + replicas)
    now = 1000.0
    index = KvIndex("bench-model", block_size)
    load = TokenLoad()
    replica_ids = [f"replica-{i:03d}" for i in range(replicas)]
    base = [rng.randrange(VOCAB) for _ in range(prompt_tokens)]
    # What the index holds, measured on the populate step alone (tracemalloc slows the
    # allocations it traces, so it is off again before any decision is timed). The token-load
    # tracker's few requests per replica are included: a few hundred bytes per replica.
    gc.collect()
    tracemalloc.start()
    traced0 = tracemalloc.get_traced_memory()[0]
    _populate(index, load, replica_ids, base, rng, now)
    gc.collect()
    index_bytes = tracemalloc.get_traced_memory()[0] - traced0
    tracemalloc.stop()
    stats = index.stats()
    suffix = max(1, prompt_tokens // 10)
    prompts = [
        base[: prompt_tokens - suffix] + [rng.randrange(VOCAB) for _ in range(suffix)]
        for _ in range(iterations)
    ]
    return BenchSetup(
        index,
        load,
        replica_ids,
        prompts,
        now,
        index_bytes,
        sum(stats.blocks_per_replica.values()),
        stats.distinct_keys,
    )


def decide_once(
    setup: BenchSetup, policy: Profile, pd_params: PdDecisionParams, token_ids: list[int], i: int
) -> PolicyDecision:
    """One decision, untimed, exactly the steps the bench times (for the profiler)."""
    index = setup.index
    keys = index.keys_for(token_ids)
    overlap = index.overlap(keys)
    request = RoutingRequest(
        request_id=f"bench-{i}",
        prompt_tokens=len(token_ids),
        block_size=index.block_size,
        block_keys=keys,
    )
    snapshots = setup.columns.build(setup.replica_ids, overlap, setup.load, setup.now)
    decision = policy.pick(request, snapshots, setup.now)
    decide_pd(request, snapshots, pd_params, setup.now)
    return decision


def measure_decision_latency(
    prompt_tokens: int,
    replicas: int,
    iterations: int = 300,
    block_size: int = 16,
    seed: int = 0,
    progress: Progress | None = None,
    policy_spec: str = "token_load",
) -> DecisionLatency:
    """Time `iterations` full routing decisions for one configuration (see module docstring)."""
    setup = setup_decisions(prompt_tokens, replicas, iterations, block_size, seed)
    index, load, replica_ids, prompts, now = (
        setup.index,
        setup.load,
        setup.replica_ids,
        setup.prompts,
        setup.now,
    )
    columns = setup.columns
    policy = build_policy(router_config_for(policy_spec).prefill)
    pd_params = PdDecisionParams()
    # The collector as in `pdorch serve` (`pdorch/app/gc_tuning.py`): start-up heap frozen,
    # young generation collected after GEN0_THRESHOLD net allocations; restored afterwards.
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)
    timings: list[float] = []
    cpu_timings: list[float] = []
    stages: dict[str, list[float]] = {
        name: []
        for name in ("block_keys", "index_match", "snapshots", "token_load_pick", "pd_decision")
    }
    overlap_total = 0
    chosen_overlap = 0
    clock = time.perf_counter_ns
    cpu_clock = time.thread_time_ns
    try:
        for i, token_ids in enumerate(prompts):
            cpu_start = cpu_clock()
            start = clock()
            keys = index.keys_for(token_ids)
            t_hash = clock()
            overlap = index.overlap(keys)
            t_match = clock()
            request = RoutingRequest(
                request_id=f"bench-{i}",
                prompt_tokens=len(token_ids),
                block_size=block_size,
                block_keys=keys,
            )
            snapshots = columns.build(replica_ids, overlap, load, now)
            t_snap = clock()
            decision = policy.pick(request, snapshots, now)
            t_pick = clock()
            decide_pd(request, snapshots, pd_params, now)
            end = clock()
            timings.append((end - start) / 1000.0)
            stages["block_keys"].append((t_hash - start) / 1000.0)
            stages["index_match"].append((t_match - t_hash) / 1000.0)
            stages["snapshots"].append((t_snap - t_match) / 1000.0)
            stages["token_load_pick"].append((t_pick - t_snap) / 1000.0)
            stages["pd_decision"].append((end - t_pick) / 1000.0)
            cpu_timings.append((cpu_clock() - cpu_start) / 1000.0)
            if decision.chosen is not None:
                chosen_overlap = overlap.get(decision.chosen, 0)
            overlap_total += chosen_overlap
            if progress is not None:
                progress(f"decide {prompt_tokens} tok x {replicas} replicas", 1)
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    timings.sort()
    cpu_timings.sort()
    return DecisionLatency(
        prompt_tokens=prompt_tokens,
        replicas=replicas,
        p50_us=_percentile(timings, 50.0),
        p99_us=_percentile(timings, 99.0),
        mean_us=statistics.fmean(timings),
        cpu_p50_us=_percentile(cpu_timings, 50.0),
        cpu_p99_us=_percentile(cpu_timings, 99.0),
        iterations=iterations,
        mean_overlap_blocks=overlap_total / max(1, iterations),
        stage_p50_us={
            name: round(_percentile(sorted(values), 50.0), 2) for name, values in stages.items()
        },
        index_entries=setup.entries,
        index_distinct_keys=setup.distinct_keys,
        index_bytes_per_entry=setup.index_bytes / max(1, setup.entries),
        index_bytes_per_key=setup.index_bytes / max(1, setup.distinct_keys),
    )


def run_router_bench(
    prompt_tokens: Sequence[int] = DEFAULT_PROMPT_TOKENS,
    replicas: Sequence[int] = DEFAULT_REPLICAS,
    iterations: int = 300,
    ingest_blocks: int = 200_000,
    block_size: int = 16,
    seed: int = 0,
    progress: Progress | None = None,
    policy: str = "token_load",
) -> RouterBenchResult:
    """Run the decision-latency grid and the ingestion measurement."""
    result = RouterBenchResult(block_size=block_size, load_average=os.getloadavg(), policy=policy)
    for tokens in prompt_tokens:
        for count in replicas:
            result.decision.append(
                measure_decision_latency(
                    tokens, count, iterations, block_size, seed, progress, policy
                )
            )
    if ingest_blocks > 0:
        if progress is not None:
            progress(f"ingest {ingest_blocks} blocks", 0)
        ingest = measure_ingest_throughput(n_blocks=ingest_blocks, block_size=block_size, seed=seed)
        result.ingest_blocks_per_s = ingest.blocks_per_s
        result.ingest_blocks = ingest.blocks
        result.ingest_seconds = ingest.seconds
        if progress is not None:
            progress(f"ingest {ingest_blocks} blocks", 1)
    return result
