"""Builders of observations and policies for the planner tests."""

from __future__ import annotations

from typing import Any

from autoscale.perf_model_base import PerfModel
from autoscale.planner import PdorchPlanner
from autoscale.policy import PoolLimits, PrefillSignal, SloPolicy, Stabilization
from autoscale.signals import (
    LatencySummary,
    Observation,
    Pool,
    PoolStatus,
    ReplicaSignals,
)

LEGACY_PERF_MODEL: dict[str, Any] = {
    "online_prefill_signal": PrefillSignal.TTFT,
    "decode_burst_queue": False,
    "decode_burst_dispersion_online": False,
    "online_skip_decode_wait": False,
}
LEGACY_PLANNER: dict[str, Any] = {
    "decode_wait_attribution": False,
    "cold_start_spare": None,
    "budget_now_first": False,
}


def _pinned(given: Any, legacy: dict[str, Any]) -> Any:
    """`legacy` under a test's own dict; a config object the test built stays as it is."""
    if given is None:
        return dict(legacy)
    if isinstance(given, dict):
        return {**legacy, **given}
    return given


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
    # The planner rule tests hand-compute their counts with the models before Round 14: the
    # TTFT prefill correction, the mean decode residence (no burst queue, no learnt dispersion,
    # no decode-wait skip), no decode-wait attribution, no cold-start spare, the budget split
    # in one tier. A test passing its own `perf_model` / `planner` dict overrides these keys; a
    # test of the shipped defaults builds `SloPolicy()` itself.
    extra["perf_model"] = _pinned(extra.get("perf_model"), LEGACY_PERF_MODEL)
    extra["planner"] = _pinned(extra.get("planner"), LEGACY_PLANNER)
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


def pinned_planner(pol: SloPolicy, perf: PerfModel, **options: Any) -> PdorchPlanner:
    """`PdorchPlanner` with the planner options before Round 14 (`LEGACY_PLANNER`) unless the
    test gives its own: the rule tests hand-compute their counts without the decode spare,
    the decode-wait attribution and the two-tier budget split."""
    for name, value in LEGACY_PLANNER.items():
        options.setdefault(name, value)
    return PdorchPlanner(pol, perf, **options)
