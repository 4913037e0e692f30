"""`health`: drop replicas the health checker took out of rotation.

Rule: keep `r` iff `r.healthy`; every other candidate is rejected as `"unhealthy"`. No
parameters. Every shipped profile starts with it; a profile left with no candidate returns
`chosen=None` ("no healthy replica").

Example (profile YAML)::

    filters: [{name: health}]
"""

from __future__ import annotations

from collections.abc import Sequence

from router.plugins.base import Filter, FilterResult, NoParams
from router.plugins.registry import register
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
