"""A finished fleet-simulator run's `SimResult`: the engines' counters summed, the sessions'
spans, and the samples the run kept (split out of `simulator.py`, issue 15: past 500 lines)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from benchmarks.fleet_sim.records import RequestRecord, SimConfig, SimResult
from benchmarks.fleet_sim.replica import SimReplica
from benchmarks.fleet_sim.sessions import SessionArrivals
from benchmarks.workloads.model import Workload


def collect_result(
    config: SimConfig,
    workload: Workload,
    replicas: Sequence[SimReplica],
    arrivals: SessionArrivals,
    records: list[RequestRecord],
    itl: array[float],
    tick_times: list[float],
    decode_kv: list[list[int]],
    decode_capable: Sequence[SimReplica],
    fast_forward_steps: int,
    wall_s: float,
) -> SimResult:
    """The run's result; a session counts once it has both started and ended."""
    queries = hits = gen = steps = 0
    for r in replicas:
        st = r.core.stats()
        queries += st.prefix_cache_queries
        hits += st.prefix_cache_hits
        gen += st.generation_tokens
        steps += st.num_steps
    starts, ends = arrivals.session_start, arrivals.session_end
    sessions = []
    for si, s in enumerate(workload.sessions):
        if si in starts and si in ends:
            sessions.append((s.session_id, s.group, starts[si], ends[si]))
    return SimResult(
        config=config,
        workload_name=workload.name,
        requests=records,
        itl_samples=itl,
        sessions=sessions,
        tick_times=tick_times,
        decode_kv_blocks=decode_kv,
        decode_replicas=[r.id for r in decode_capable],
        engine_prefix_queries=queries,
        engine_prefix_hits=hits,
        generation_tokens=gen,
        num_steps=steps,
        num_fast_forward_steps=fast_forward_steps,
        wall_s=wall_s,
    )
