"""One replica as the fleet simulator sees it: its engine core and driver, plus the P/D plumbing
the event loop books around it (legs headed to it, its inbound KV link, transfers in flight).

`make_engine_core` is the one place a replica's core is configured, so every replica of a run,
static or added later by `membership.py`, is configured alike.
"""

from __future__ import annotations

from benchmarks.fleet_sim.records import SimConfig
from benchmarks.workloads.model import Workload
from pools.sim.config import EngineConfig
from pools.sim.driver import EngineDriver
from pools.sim.engine_core import EngineCore
from pools.sim.timing import TimingModel


class SimReplica:
    """A replica: `core` stepped by `driver`; `next_event` is its scheduled step (None: idle)."""

    __slots__ = (
        "blocks_capacity",
        "core",
        "driver",
        "id",
        "inbound",
        "index",
        "link_free",
        "next_event",
        "role",
        "transfers",
    )

    def __init__(self, rid: str, role: str, index: int, core: EngineCore) -> None:
        self.id = rid
        self.role = role
        self.index = index
        self.core = core
        self.driver = EngineDriver(core)
        self.next_event: float | None = None
        self.inbound: dict[int, int] = {}  # prefill replica index -> legs headed here
        self.transfers: list[float] = []  # heap of transfer-done times into this replica
        self.link_free = 0.0  # transfers into one replica are serialized on its link
        self.blocks_capacity = core.block_pool.num_gpu_blocks - 1


def make_engine_core(
    config: SimConfig, timing: TimingModel, max_model_len: int, engine_id: str
) -> EngineCore:
    """One replica's engine core (vLLM defaults from `config`, KV pool from `timing`)."""
    ecfg = EngineConfig(
        block_size=config.block_size,
        num_gpu_blocks=None,
        vocab_size=None,
        kv_lease_duration_s=30.0,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        max_model_len=max_model_len,
        engine_id=engine_id,
    )
    return EngineCore(ecfg, timing)


def max_model_len_for(workload: Workload, timing: TimingModel, block_size: int) -> int:
    """Every replica's `max_model_len`: the longest request (prompt + output) plus two blocks,
    at least 2048; a request that needs more KV blocks than a replica holds is a config error."""
    longest = 0
    for s in workload.sessions:
        for k, t in enumerate(s.turns):
            longest = max(longest, s.prompt_tokens(k) + t.output_tokens)
    capacity = timing.num_gpu_blocks(block_size) - 1
    if -(-longest // block_size) > capacity:
        raise ValueError(
            f"workload: a request of {longest} tokens needs more KV blocks than a replica "
            f"holds ({capacity} blocks of {block_size}); use a bigger --gpu or --tp"
        )
    return max(2048, longest + 2 * block_size)
