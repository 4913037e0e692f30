"""`health`: drop replicas the health checker took out of rotation.

Rule: keep `r` iff `r.healthy`; every other candidate is rejected as `"unhealthy"`. No
parameters. Every shipped profile starts with it; a profile left with no candidate returns
`chosen=None` ("no healthy replica").

Example (profile YAML)::

    filters: [{name: health}]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from router.plugins.base import ColumnFilterResult, Filter, FilterResult, NoParams
from router.plugins.registry import register
from router.replica_columns import BoolArray, ReplicaColumns
from router.replica_state import ReplicaSnapshot, RoutingRequest


@register
class HealthFilter(Filter[NoParams]):
    """Healthy replicas only."""

    name = "health"

    def filter(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> FilterResult:
        kept = [r for r in candidates if r.healthy]
        rejected = {r.replica_id: "unhealthy" for r in candidates if not r.healthy}
        return FilterResult(kept, rejected)

    def supports_columns(self) -> bool:
        return True

    def filter_columns(
        self, request: RoutingRequest, candidates: ReplicaColumns, kept: BoolArray, now: float
    ) -> ColumnFilterResult:
        healthy = candidates.healthy
        ids = candidates.ids
        dropped = np.flatnonzero(kept & ~healthy).tolist()
        return ColumnFilterResult(kept & healthy, {ids[i]: "unhealthy" for i in dropped})
