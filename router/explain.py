"""Every routing decision as a JSON-serialisable structure, for the coordinator's explain API.

`explain_pick` turns a policy's `PolicyDecision` plus the snapshots it saw into a
`PickExplanation` (one row per replica: overlap blocks, prefill tokens left, decode load, KV
usage, score and its terms, chosen or why rejected); `explain_pd` does the same for the P/D
decision; `DecisionExplanation` bundles prefill pick, P/D decision and decode pick of one
request. Built only when asked for: the request path keeps the cheap dataclasses.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from router.pd_decision import PdDecision
from router.replica_state import PolicyDecision, ReplicaSnapshot


class ReplicaExplanation(BaseModel):
    """One candidate replica in one pick."""

    model_config = ConfigDict(frozen=True)
    replica_id: str
    healthy: bool
    overlap_blocks: int
    prefill_tokens_left: int
    decode_blocks: int
    kv_usage: float
    num_running: int
    num_waiting: int
    requests_in_flight: int
    score: float | None
    terms: dict[str, float]
    chosen: bool
    rejected: str | None = None


class PickExplanation(BaseModel):
    """One policy's pick: which replica, why, and every candidate's numbers."""

    model_config = ConfigDict(frozen=True)
    role: str
    policy: str
    chosen: str | None
    reason: str
    higher_is_better: bool
    replicas: list[ReplicaExplanation]


class PdExplanation(BaseModel):
    """The P/D decision with its inputs."""

    model_config = ConfigDict(frozen=True)
    disaggregate: bool
    reason: str
    uncached_tokens: int
    min_uncached_tokens: int
    min_prefill_queue_s: float | None
    max_prefill_queue_s: float
    healthy_prefill_replicas: int


class DecisionExplanation(BaseModel):
    """Everything the router decided for one request."""

    model_config = ConfigDict(frozen=True)
    request_id: str
    now: float
    prompt_tokens: int
    prompt_blocks: int
    prefill: PickExplanation | None = None
    pd: PdExplanation | None = None
    decode: PickExplanation | None = None


def explain_pick(
    role: str, decision: PolicyDecision, replicas: Sequence[ReplicaSnapshot]
) -> PickExplanation:
    """The explain view of one `pick`."""
    rows = [
        ReplicaExplanation(
            replica_id=r.replica_id,
            healthy=r.healthy,
            overlap_blocks=r.overlap_blocks,
            prefill_tokens_left=r.prefill_tokens_queued,
            decode_blocks=r.decode_blocks,
            kv_usage=r.kv_usage,
            num_running=r.num_running,
            num_waiting=r.num_waiting,
            requests_in_flight=r.requests_in_flight,
            score=decision.scores.get(r.replica_id),
            terms=dict(decision.details.get(r.replica_id, {})),
            chosen=r.replica_id == decision.chosen,
            rejected=decision.rejected.get(r.replica_id),
        )
        for r in replicas
    ]
    return PickExplanation(
        role=role,
        policy=decision.policy,
        chosen=decision.chosen,
        reason=decision.reason,
        higher_is_better=decision.higher_is_better,
        replicas=rows,
    )


def explain_pd(decision: PdDecision) -> PdExplanation:
    """The explain view of a P/D decision."""
    return PdExplanation(
        disaggregate=decision.disaggregate,
        reason=decision.reason,
        uncached_tokens=decision.uncached_tokens,
        min_uncached_tokens=decision.min_uncached_tokens,
        min_prefill_queue_s=decision.min_prefill_queue_s,
        max_prefill_queue_s=decision.max_prefill_queue_s,
        healthy_prefill_replicas=decision.healthy_prefill_replicas,
    )
