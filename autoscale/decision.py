"""What a planner answers: desired replicas per pool, role moves, and why.

`reason` names the term that bound each pool's count (e.g. `"ttft-throughput"`,
`"itl-concurrency"`, `"min"`, `"max"`, `"budget"`, `"stabilization"`, `"pending"`,
`"hold"`), so `/admin/autoscale`, the reports and the tests can say why a count is what it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autoscale.signals import Pool


@dataclass(frozen=True, slots=True)
class RoleMove:
    """Move `count` replicas from one pool to the other without a restart (vLLM `kv_both`)."""

    from_pool: Pool
    to_pool: Pool
    count: int = 1


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    """Desired replicas (ready + pending, after `moves` are applied) per pool.

    An actuator applies `moves` first (each moves one replica's role after draining its
    current-role work), then starts or drains replicas to reach `desired`.
    """

    now: float
    desired: dict[Pool, int]
    reasons: dict[Pool, str]
    moves: tuple[RoleMove, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)  # the inputs/terms, for explain

    def gpus(self, gpus_per_replica: dict[Pool, int]) -> int:
        return sum(n * gpus_per_replica.get(p, 1) for p, n in self.desired.items())
