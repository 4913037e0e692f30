"""The per-request P/D decision: disaggregate, or let the decode replica prefill locally.

Rule (pure; `now` is passed for symmetry with the other decision code and is not read):

    uncached_local = max(0, prompt_tokens - local_overlap_blocks * block_size)
    queue_s(p)     = prefill_tokens_queued(p) / tps(p)          for healthy prefill replicas p
    saturated      = no healthy prefill replica, or min_p queue_s(p) > max_prefill_queue_s

    disaggregate   = enabled and uncached_local >= min_uncached_tokens and not saturated

`local_overlap_blocks` is what the decode replica that would prefill locally already caches
(0 when not known yet). This is Dynamo's conditional disaggregation, in token-load terms: a
short uncached prompt costs the decode batch little and saves a KV transfer; a long one stalls
every sequence decoding beside it, so it goes to the prefill pool, unless that pool is so
backed up that even its least-loaded replica would start this prefill later than the budget.
`tps(p)` is the replica's profiled prefill tokens/s, else `default_prefill_tokens_per_s`.

Parameters (defaults): `enabled` true, `min_uncached_tokens` 512, `max_prefill_queue_s` 1.0,
`default_prefill_tokens_per_s` 10000, `compare_finish` false, `transfer_s_per_token` 3.3e-6.

**Queue-aware check** (`compare_finish: true`, issue 15; off by default): where the rule
above says disaggregate, prefill locally instead when that finishes sooner:

    finish(r)   = (prefill_tokens_queued(r) + uncached(r)) / tps(r)
    remote      = min_p finish(p) + uncached(d) · transfer_s_per_token   (d pulls what it lacks)
    local       = local_weight · finish(d)                    d: the picked decode replica
    local < remote  ->  decode prefills locally

`local_weight` (default 3.0) stands for what a local prefill costs beyond its own time: it
shares d's steps with d's decode batch (slower for both; the reason to disaggregate at all).
With 1.0 (no such cost) the first 400 Mooncake rows on 8P8D x2 went local 62 % of the time
and lost (p95 2,351 -> 2,573 ms, TPOT p99 6.4 -> 28.7 ms). 3.3e-6 s per
token is 128 KiB/token of Llama-3.1-8B KV at 40 GB/s (`token_load_decode`'s transfer term).

On `ReplicaColumns` (`router/replica_columns.py`) the queue times are one array division
(the same float division per replica, the same minimum) instead of a loop over snapshots; at
most `SCALAR_ROWS` (8) replicas they are that division in Python on the columns' values (the
same result; the six numpy calls cost more than the loop there, `benchmarks/results/proxy.md`,
"leg-client-3").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from router.replica_columns import SCALAR_ROWS, ReplicaColumns
from router.replica_state import ReplicaSnapshot, RoutingRequest


class PdDecisionParams(BaseModel):
    """Parameters of the P/D decision."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    min_uncached_tokens: int = Field(default=512, ge=0)
    max_prefill_queue_s: float = Field(default=1.0, ge=0.0)
    default_prefill_tokens_per_s: float = Field(default=10_000.0, gt=0.0)
    compare_finish: bool = False
    transfer_s_per_token: float = Field(default=3.3e-6, ge=0.0)
    local_weight: float = Field(default=3.0, gt=0.0)


def _finish_s(r: ReplicaSnapshot, request: RoutingRequest, default_tps: float) -> float:
    """When `request`'s prefill would finish on `r` if sent now: its queued prefill plus our
    uncached tokens, at its tokens/s."""
    uncached = request.uncached_tokens(r.overlap_blocks)
    return (r.prefill_tokens_queued + uncached) / (r.prefill_tokens_per_s or default_tps)


def local_finishes_sooner(
    request: RoutingRequest,
    prefill_replicas: Sequence[ReplicaSnapshot],
    local: ReplicaSnapshot,
    params: PdDecisionParams,
) -> tuple[bool, float, float]:
    """The queue-aware check (module docstring, `compare_finish`): (local sooner, local s,
    remote s)."""
    tps = params.default_prefill_tokens_per_s
    remote = min(_finish_s(p, request, tps) for p in prefill_replicas if p.healthy)
    pulled = request.uncached_tokens(local.overlap_blocks)  # KV the decode replica must pull
    remote += pulled * params.transfer_s_per_token
    local_s = params.local_weight * _finish_s(local, request, tps)
    return local_s < remote, local_s, remote


@dataclass(frozen=True, slots=True)
class PdDecision:
    """The decision with the numbers it was made from.

    `why` is the reason as given: the text, or a function of the decision's own numbers that
    formats it; read it as `reason`. Why lazy: the f-string with two float formats was a
    fifth of `decide_pd` on the proxy's hot path (issue 15, proxy-8), and only explain, reports
    and logs read it. The text is the same either way (`tests/router/test_pd_decision.py`).
    """

    disaggregate: bool
    why: str | Callable[[PdDecision], str]
    uncached_tokens: int
    min_uncached_tokens: int
    min_prefill_queue_s: float | None
    max_prefill_queue_s: float
    healthy_prefill_replicas: int

    @property
    def reason(self) -> str:
        """Why (module docstring's rule, with the numbers): formatted on each read."""
        why = self.why
        return why if isinstance(why, str) else why(self)


def decide_pd(
    request: RoutingRequest,
    prefill_replicas: Sequence[ReplicaSnapshot],
    params: PdDecisionParams,
    now: float,
    local_overlap_blocks: int = 0,
    local: ReplicaSnapshot | None = None,
) -> PdDecision:
    """Decide whether `request` is prefilled remotely (see module docstring)."""
    uncached = request.uncached_tokens(local_overlap_blocks)
    min_queue: float | None
    if isinstance(prefill_replicas, ReplicaColumns) and len(prefill_replicas) <= SCALAR_ROWS:
        queued_column = prefill_replicas.column("prefill_tokens_queued")
        assert queued_column is not None
        default_tps = params.default_prefill_tokens_per_s
        queue_s = [
            q / (t if t != 0.0 else default_tps)
            for q, t, ok in zip(
                queued_column.tolist(),
                prefill_replicas.tps.tolist(),
                prefill_replicas.healthy.tolist(),
                strict=True,
            )
            if ok
        ]
        n_healthy = len(queue_s)
        min_queue = min(queue_s) if queue_s else None
    elif isinstance(prefill_replicas, ReplicaColumns):
        mask = prefill_replicas.healthy
        n_healthy = int(np.count_nonzero(mask))
        tps = prefill_replicas.tps[mask]
        queued = prefill_replicas.column("prefill_tokens_queued")
        assert queued is not None
        queue = queued[mask] / np.where(tps != 0.0, tps, params.default_prefill_tokens_per_s)
        min_queue = float(queue.min()) if n_healthy else None
    else:
        healthy = [p for p in prefill_replicas if p.healthy]
        n_healthy = len(healthy)
        queue_s = [
            p.prefill_tokens_queued
            / (p.prefill_tokens_per_s or params.default_prefill_tokens_per_s)
            for p in healthy
        ]
        min_queue = min(queue_s) if queue_s else None

    def decision(disaggregate: bool, why: str | Callable[[PdDecision], str]) -> PdDecision:
        return PdDecision(
            disaggregate=disaggregate,
            why=why,
            uncached_tokens=uncached,
            min_uncached_tokens=params.min_uncached_tokens,
            min_prefill_queue_s=min_queue,
            max_prefill_queue_s=params.max_prefill_queue_s,
            healthy_prefill_replicas=n_healthy,
        )

    if not params.enabled:
        return decision(False, "disaggregation disabled: decode prefills locally")
    if uncached < params.min_uncached_tokens:
        return decision(False, _too_short)
    if min_queue is None:
        return decision(False, "no healthy prefill replica: decode prefills locally")
    if min_queue > params.max_prefill_queue_s:
        return decision(False, _saturated)
    if params.compare_finish and local is not None:
        sooner, local_s, remote_s = local_finishes_sooner(request, prefill_replicas, local, params)
        if sooner:
            return decision(
                False,
                f"local prefill finishes sooner ({local_s:.3f} s < {remote_s:.3f} s on the "
                "prefill pool, transfer included): decode prefills locally",
            )
    return decision(True, _disaggregate)


# The reasons read from the decision's own fields (module functions: no closure per request).
def _too_short(d: PdDecision) -> str:
    return (
        f"uncached prompt {d.uncached_tokens} < {d.min_uncached_tokens} tokens: "
        "decode prefills locally"
    )


def _saturated(d: PdDecision) -> str:
    return (
        f"prefill pool saturated (min queue {d.min_prefill_queue_s:.3f} s > "
        f"{d.max_prefill_queue_s:g} s): decode prefills locally"
    )


def _disaggregate(d: PdDecision) -> str:
    return (
        f"uncached prompt {d.uncached_tokens} >= {d.min_uncached_tokens} tokens and min prefill "
        f"queue {d.min_prefill_queue_s:.3f} s <= {d.max_prefill_queue_s:g} s: disaggregate"
    )
