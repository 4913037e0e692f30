"""`role`: keep replicas of the given pool roles (a mixed candidate list, e.g. colocated
replicas offered as decode targets).

Rule: keep `r` iff `r.role in roles`, or `r.role` is None (not given) and `keep_unknown`;
others are rejected as `"role R not in [...]"`. `PdRouter` passes one pool per pick, so the
shipped profiles do not need it.

Parameters (defaults): `roles` (`[decode, colocated]`), `keep_unknown` (true).

Example::

    filters: [{name: health}, {name: role, params: {roles: [decode]}}]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from router.plugins.base import Filter, FilterResult
from router.plugins.registry import register
from router.replica_state import ReplicaSnapshot, RoutingRequest

Role = Literal["prefill", "decode", "colocated"]


def _default_roles() -> list[Role]:
    return ["decode", "colocated"]


class RoleParams(BaseModel):
    """Parameters of the `role` filter."""

    model_config = ConfigDict(extra="forbid")
    roles: list[Role] = Field(default_factory=_default_roles, min_length=1)
    keep_unknown: bool = True


@register
class RoleFilter(Filter[RoleParams]):
    """Replicas of the configured roles."""

    name = "role"
    params_model = RoleParams

    def filter(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> FilterResult:
        roles: set[str | None] = set(self.params.roles)
        if self.params.keep_unknown:
            roles.add(None)
        kept: list[ReplicaSnapshot] = []
        rejected: dict[str, str] = {}
        for r in candidates:
            if r.role in roles:
                kept.append(r)
            else:
                rejected[r.replica_id] = f"role {r.role} not in {list(self.params.roles)}"
        return FilterResult(kept, rejected)
