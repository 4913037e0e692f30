"""Builders of observations and policies for the planner tests."""

from __future__ import annotations

from typing import Any

from autoscale.policy import PerfModelConfig, PoolLimits, PrefillSignal, SloPolicy, Stabilization
from autoscale.signals import (
    LatencySummary,
    Observation,
    Pool,
    PoolStatus,
    ReplicaSignals,
)


def policy(
    *,
    down_s: float = 0.0,
    up_s: float = 0.0,
    pmax: int = 16,
    dmax: int = 16,
    budget: int | None = None,
    role_switching: bool = False,
    pgpus: int = 1,
    startup_s: float = 120.0,
    **extra: Any,
) -> SloPolicy:
    # the planner rule tests read the TTFT prefill correction (the default before Round 13)
    extra.setdefault("perf_model", PerfModelConfig(online_prefill_signal=PrefillSignal.TTFT))
    return SloPolicy(
        pools={
            Pool.PREFILL: PoolLimits(min=1, max=pmax, gpus_per_replica=pgpus, startup_s=startup_s),
            Pool.DECODE: PoolLimits(min=1, max=dmax, startup_s=startup_s),
        },
        gpu_budget=budget,
        stabilization=Stabilization(scale_up_s=up_s, scale_down_s=down_s),
        role_switching=role_switching,
        **extra,
    )


def latency(p: float, count: int = 100) -> LatencySummary:
    return LatencySummary(count=count, p50_s=p, p90_s=p, p99_s=p, mean_s=p)


def replicas(pool: Pool, n: int, **signals: Any) -> tuple[ReplicaSignals, ...]:
    return tuple(ReplicaSignals(f"{pool}-{i}", pool, **signals) for i in range(n))


def observation(
    now: float = 0.0,
    *,
    p: tuple[int, int] = (1, 0),
    d: tuple[int, int] = (1, 0),
    rate: float = 0.0,
    isl: float = 1000.0,
    osl: float = 200.0,
    hit: float = 0.0,
    ttft: LatencySummary | None = None,
    itl: LatencySummary | None = None,
    reps: tuple[ReplicaSignals, ...] = (),
    window_s: float = 5.0,
) -> Observation:
    return Observation(
        now=now,
        window_s=window_s,
        pools={
            Pool.PREFILL: PoolStatus(ready=p[0], pending=p[1]),
            Pool.DECODE: PoolStatus(ready=d[0], pending=d[1]),
        },
        num_requests=round(rate * window_s),
        arrival_rps=rate,
        mean_isl_tokens=isl,
        mean_osl_tokens=osl,
        prefix_hit_rate=hit,
        ttft=ttft or LatencySummary(),
        itl=itl or LatencySummary(),
        replicas=reps,
    )
