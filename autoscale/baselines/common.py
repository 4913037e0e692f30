"""Small pieces the baseline planners share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autoscale.baselines.hpa_behavior import HpaController
from autoscale.decision import ScaleDecision
from autoscale.policy import SloPolicy
from autoscale.signals import Observation, Pool, ReplicaSignals
from autoscale.sizing import clamp_to_limits

POOLS = (Pool.PREFILL, Pool.DECODE)


def clamp(policy: SloPolicy, pool: Pool, n: int, reason: str) -> tuple[int, str]:
    """`n` within [min, max]; the reason becomes the bound's name when one bites."""
    m, bound = clamp_to_limits(policy, pool, n)
    return m, bound or reason


def waiting_requests(r: ReplicaSignals) -> float:
    """vLLM `vllm:num_requests_waiting` of one replica."""
    return float(r.num_waiting)


def kv_usage(r: ReplicaSignals) -> float:
    """vLLM `vllm:kv_cache_usage_perc` (0..1) of one replica."""
    return r.kv_usage


def pool_metric(obs: Observation, pool: Pool) -> list[float]:
    """The metric the HPA-style baselines scale `pool` on, per ready replica: KV usage for
    decode, waiting requests for prefill (see `hpa_kv_util`)."""
    read = kv_usage if pool is Pool.DECODE else waiting_requests
    return [read(r) for r in obs.replicas_of(pool)]


def hpa_step(
    policy: SloPolicy, hpa: HpaController, pool: Pool, now: float, current: int, rec: int
) -> tuple[int, str]:
    """The recommendation clamped to [min, max] (as HPA bounds it), then HPA's stabilization
    and rate policies; the reason names the bound when the clamped value went through."""
    clamped, bound = clamp_to_limits(policy, pool, rec)
    n, why = hpa.decide(now, current, clamped)
    return n, bound if bound and n == clamped else why


PoolStep = Callable[[Pool], tuple[int, str, dict[str, Any]]]


def per_pool_decision(now: float, step: PoolStep) -> ScaleDecision:
    """One decision from `step(pool)` → (desired, reason, details) for each pool (no moves)."""
    desired: dict[Pool, int] = {}
    reasons: dict[Pool, str] = {}
    details: dict[str, Any] = {}
    for p in POOLS:
        desired[p], reasons[p], details[str(p)] = step(p)
    return ScaleDecision(now, desired, reasons, (), details)


def held_decision(last: ScaleDecision | None, now: float, period_s: float) -> ScaleDecision | None:
    """The last decision repeated at `now` while its sync period runs (an HPA decides once per
    period and holds in between); None once the period is over (or before any decision)."""
    if last is not None and now - last.now < period_s - 1e-9:
        return ScaleDecision(now, dict(last.desired), dict(last.reasons))
    return None
