"""The live fleet of `pdorch bench autoscale --live` and the workload it is sent, time-compressed.

`live_fleet_config`: a coordinator with a prefill and a decode pool, each launching
`pdorch engine sim` processes (`in_process: false`: one process per replica, as the local
actuator starts them) of the policy's model, GPU and TP, at `time_scale` t. The parts of the
fleet that are in the what-if's fleet simulator are set to match it:

- routing: the what-if's router policy pair (`benchmarks/fleet_sim/policies.py`, default
  token_load / token_load_decode) and the P/D decision's defaults, with its two time-valued
  parameters in real time: `max_prefill_queue_s` x t, `default_prefill_tokens_per_s` / t (an
  engine t x faster prefills 1/t x the tokens per real second);
- engines: the what-if's block size, the profile's KV pool (`num_blocks` unset in both), vLLM's
  default `max_num_seqs` / `max_num_batched_tokens`, a `max_model_len` that holds the
  workload's longest request, KV moved over TCP between the processes;
- the coordinator scrapes the engines every `metrics_interval_s` real seconds (default
  2 virtual seconds x t, the what-if's observation is exact at every tick).

`compress_workload`: the same sessions with every `start_s` and `think_time_s` x t.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autoscale.policy import SloPolicy
from autoscale.signals import Pool
from benchmarks.fleet_sim.policies import router_config_for
from benchmarks.workloads.model import Workload
from pdorch.config.fleet import FleetConfig, parse_fleet_config
from router.pd_decision import PdDecisionParams

SERVED_MODEL = "sim-live"


def compress_workload(workload: Workload, time_scale: float) -> Workload:
    """`workload` with arrival times and think times x `time_scale` (its own name kept)."""
    sessions = [
        dataclasses.replace(
            s,
            start_s=None if s.start_s is None else s.start_s * time_scale,
            turns=[
                dataclasses.replace(t, think_time_s=t.think_time_s * time_scale) for t in s.turns
            ],
        )
        for s in workload.sessions
    ]
    meta = {**workload.meta, "time_scale": time_scale}
    return dataclasses.replace(workload, sessions=sessions, meta=meta)


def longest_request_tokens(workload: Workload) -> int:
    """Prompt + output tokens of the workload's longest request."""
    return max(
        (
            s.prompt_tokens(k) + t.output_tokens
            for s in workload.sessions
            for k, t in enumerate(s.turns)
        ),
        default=0,
    )


def live_fleet_config(
    policy: SloPolicy,
    initial: dict[Pool, int],
    *,
    time_scale: float,
    block_size: int,
    router_policy: str,
    max_model_len: int,
    metrics_interval_s: float | None = None,
) -> FleetConfig:
    """The fleet file of the live run (module docstring)."""
    router = router_config_for(router_policy)
    pd: PdDecisionParams = router.pd
    sim: dict[str, Any] = {
        "kind": "sim",
        "in_process": False,
        "model_profile": policy.model_profile,
        "gpu": policy.gpu,
        "tp": policy.tp,
        "time_scale": time_scale,
        "max_model_len": max_model_len,
        "kv_transport": "tcp",
    }
    data: dict[str, Any] = {
        "served_model_name": SERVED_MODEL,
        "block_size": block_size,
        "pools": {
            "prefill": {
                "policy": router.prefill.model_dump(mode="json"),
                "launch": [{**sim, "count": initial[Pool.PREFILL]}],
            },
            "decode": {
                "policy": router.decode.model_dump(mode="json"),
                "launch": [{**sim, "count": initial[Pool.DECODE]}],
            },
        },
        "pd": {
            "enabled": pd.enabled,
            "min_uncached_tokens": pd.min_uncached_tokens,
            "max_prefill_queue_s": pd.max_prefill_queue_s * time_scale,
            "default_prefill_tokens_per_s": pd.default_prefill_tokens_per_s / time_scale,
        },
        "coordinator": {"host": "127.0.0.1", "port": 0},
        "metrics": {
            "interval_s": metrics_interval_s if metrics_interval_s else max(0.05, 2.0 * time_scale)
        },
        # a shared 2-core machine can be slow to answer a probe; a dead engine refuses at once
        "health": {"timeout_s": 2.0},
    }
    return parse_fleet_config(data)
