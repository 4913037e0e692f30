"""A cold-start spare learnt from the load: how far the need grew within one cold start, lately.

`planner.cold_start_spare` s (`autoscale.predictive_floor`, "Cold-start spare") asks the floor
for the load `startup_s` ahead for at least the floor for the load now plus s replicas, so the
pool already holds what the load can add while a replica ordered now starts. A fixed s is a
guess at that growth: 1.5 decode replicas carried the Azure trace's opening ramp (Round 13) but
stood all hour in its steady segments (1.51 decode GPU-h above the oracle, Round 14), and on the
live examples' 2-3 replica pools it was one extra replica all the time. `LearntSpare` measures
it instead, per pool, from the floor's own need for the load now (`need(τ)`, fractional
replicas, one point per `compute`):

    g(τ) = [need(τ + S) - need(τ)]⁺          the growth within one cold start S = `startup_s`
                                             (need(τ + S): the first point at or after τ + S)
    s(t) = min(cap, Q_q{ g(τ) : t - W <= τ + S <= t })

`Q_q` is the q-quantile (linear between order statistics) of the growths that completed within
the last W seconds: where the need jumps within one cold start the spare is that jump, where it
is flat or falls the spare is ~0. Before `prior_s` seconds of points (counted from the first),
the spare is `max(prior, s(t))`: the first cold start has no growth to read yet, and a run's
opening is where the fixed spare won (the prior is the policy's `cold_start_spare` value).

Parameters (`LearntSpareOptions`, the policy's `planner.cold_start_spare_learnt`; selected by
`planner.cold_start_spare_mode: learnt`):
- `window_s` W (default 1200): how far back growths count. Long enough to keep the last ramp
  of a bursty trace (the Azure hour's ramps recur every 5-15 min), short enough to forget a
  phase that ended.
- `quantile` q (default 0.95): the growth a cold start must absorb in all but 1 in 20 starts.
- `cap` (default 3.0 replicas): a bound on the spare whatever the window saw (a one-off jump
  would otherwise stand for W).
- `prior_s` (default 300): how long the prior stands as a minimum (one cold start plus the
  `scale_down_s` window's worth of points).
- `smooth_s` (default 0: off): need(τ) is the mean of the points of the last `smooth_s`, so
  a 5 s window's arrival noise (Azure x14: ±18 % per window) is not read as growth.

Pure: `now` comes with each point; the state is the recent points and growths.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class SpareMode(StrEnum):
    """How `planner.cold_start_spare` is read (module docstring)."""

    FIXED = "fixed"  # the policy's replicas, standing all run
    LEARNT = "learnt"  # `LearntSpare`, the policy's replicas its prior


class LearntSpareOptions(BaseModel):
    """`planner.cold_start_spare_learnt` (module docstring: W, q, cap, prior)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_s: float = Field(default=1200.0, gt=0)
    quantile: float = Field(default=0.95, ge=0, le=1)
    cap: float = Field(default=3.0, ge=0, le=16)
    prior_s: float = Field(default=300.0, ge=0)
    smooth_s: float = Field(default=0.0, ge=0)


# the planner's keyword default: the options' defaults, as `PlannerOptions.model_dump()` has them
DEFAULT_LEARNT_SPARE: Mapping[str, Any] = MappingProxyType(LearntSpareOptions().model_dump())


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values`, linear between order statistics (0 when empty)."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class LearntSpare:
    """One pool's learnt cold-start spare (module docstring)."""

    def __init__(self, startup_s: float, prior: float, options: LearntSpareOptions) -> None:
        self.startup_s = startup_s
        self.prior = prior
        self.options = options
        self._open: deque[tuple[float, float]] = deque()  # points waiting for τ + S
        self._growth: deque[tuple[float, float]] = deque()  # (τ + S, g(τ))
        self._first: float | None = None
        self._last: float | None = None
        self._value = prior
        self._recent: deque[tuple[float, float]] = deque()  # the points of the last `smooth_s`

    def observe(self, now: float, need: float) -> float:
        """Add the need for the load now at `now` (a repeated or older `now` is ignored);
        returns the spare at `now`."""
        if self._last is not None and now <= self._last:
            return self._value
        if self._first is None:
            self._first = now
        self._last = now
        if self.options.smooth_s > 0:
            # the mean over the last `smooth_s`: a 5 s window's need is arrival noise
            self._recent.append((now, need))
            while self._recent[0][0] <= now - self.options.smooth_s + 1e-9:
                self._recent.popleft()
            need = sum(n for _, n in self._recent) / len(self._recent)
        while self._open and self._open[0][0] + self.startup_s <= now + 1e-9:
            _, before = self._open.popleft()
            self._growth.append((now, max(0.0, need - before)))
        self._open.append((now, need))
        while self._growth and self._growth[0][0] < now - self.options.window_s - 1e-9:
            self._growth.popleft()
        learnt = min(
            self.options.cap, quantile([g for _, g in self._growth], self.options.quantile)
        )
        if now - self._first < self.options.prior_s:
            learnt = max(learnt, self.prior)
        self._value = learnt
        return learnt

    def value(self) -> float:
        """The spare as of the last point (the prior before any)."""
        return self._value
