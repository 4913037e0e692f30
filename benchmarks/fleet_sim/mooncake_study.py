"""What the Mooncake routing studies share (`prefill_floor`, `hit_loss`, `ttft_parts`): the
trace, the simulated fleet they run it on, and their command line, so the three tools read
the same cell the same way (`sim-route-defaults`: Mooncake conversation trace, block size
512, H200 replicas)."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.fleet_sim.fleet import FleetSpec
from benchmarks.fleet_sim.records import SimConfig
from benchmarks.workloads.model import Workload
from benchmarks.workloads.traces import load_mooncake

TRACE = Path("benchmarks/traces/mooncake/conversation_trace.jsonl")
BLOCK_SIZE = 512  # the studies' KV block size (the trace's hash block)


def study_cell(
    fleet: str, rate_scale: float, policy: str, max_requests: int | None, gpu: str = "h200"
) -> tuple[Workload, SimConfig]:
    """The trace rate-scaled and the fleet config of one study cell."""
    wl = load_mooncake(TRACE, rate_scale=rate_scale, max_requests=max_requests)
    config = SimConfig(FleetSpec.parse(fleet), policy=policy, gpu=gpu, block_size=BLOCK_SIZE)
    return wl, config


def study_parser(doc: str | None, fleet: str) -> argparse.ArgumentParser:
    """`--fleet --rate-scale --policy --max-requests`, the first paragraph of `doc` as help."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--fleet", default=fleet)
    ap.add_argument("--rate-scale", type=float, default=3.0)
    ap.add_argument("--policy", default="token_load")
    ap.add_argument("--max-requests", type=int, default=None)
    return ap
