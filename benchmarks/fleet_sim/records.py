"""What one fleet-simulation run is told and what it hands back: `SimConfig` (the CLI's
options), `RequestRecord` (one request's life in virtual seconds) and `SimResult` (everything
`metrics.compute_metrics` and the reports read). Plain data, no behaviour: the event loop
(`simulator.py`) fills them, `metrics.py`, `report.py` and `benchmarks/autoscale_sim` read them.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from benchmarks.fleet_sim.fleet import FleetSpec
from router.policies.config import RouterPolicyConfig


@dataclass(slots=True)
class SimConfig:
    """One simulation run's settings (the CLI's options)."""

    fleet: FleetSpec
    policy: str = "token_load"
    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    tp: int = 1
    block_size: int = 64
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    link: str | None = None
    tick_s: float = 0.5
    fast_forward: bool = True
    seed: int = 0
    kv_memory_gb: float | None = None
    # The router's policies as a fleet file gives them; None: `router_config_for(policy)`.
    router: RouterPolicyConfig | None = None


@dataclass(slots=True)
class RequestRecord:
    """One request's life, in virtual seconds."""

    request_id: str
    session: int
    turn: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    prefill_replica: str | None = None
    decode_replica: str = ""
    disaggregated: bool = False
    first_token: float | None = None
    # the prefill leg's end (its KV ready for the decode replica); None when not disaggregated
    prefill_end: float | None = None
    last_token: float | None = None
    finish: float | None = None
    num_output: int = 0
    hit_tokens: int = 0
    oracle_hit_tokens: int = 0
    lru_hit_tokens: int = 0
    transfer_tokens: int = 0
    finish_count: int = 0
    max_itl: float = 0.0


@dataclass(slots=True)
class SimResult:
    """Everything `metrics.compute_metrics` needs, plus run facts."""

    config: SimConfig
    workload_name: str
    requests: list[RequestRecord]
    itl_samples: array[float]
    sessions: list[tuple[str, str | None, float, float]]  # (id, group, start, end)
    tick_times: list[float]
    decode_kv_blocks: list[list[int]]  # per tick, per decode-capable replica
    decode_replicas: list[str]
    engine_prefix_queries: int
    engine_prefix_hits: int
    generation_tokens: int
    num_steps: int
    num_fast_forward_steps: int
    wall_s: float
    cpu_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)
