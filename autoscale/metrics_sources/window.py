"""Window arithmetic shared by the sources that difference two reads of cumulative metrics."""

from __future__ import annotations

from autoscale.signals import Pool


def delta(current: float, previous: float | None) -> float:
    """Increase of a counter between two reads; a counter that went down restarted."""
    if previous is None or current < previous:
        return current
    return current - previous


def mean_or_zero(total: float, count: float) -> float:
    return total / count if count > 0 else 0.0


def pool_of(name: str) -> Pool | None:
    """The planner pool a pool name means (None for pools a planner does not size)."""
    try:
        return Pool(name)
    except ValueError:
        return None
