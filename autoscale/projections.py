"""How far pdorch's planner trusts a rate projected `startup_s` ahead (two rules, pure).

The predictive floor (`autoscale.planner`, step 1) sizes a pool for the rate the forecaster
projects `startup_s` (120 s) ahead, so cold starts are ordered before the load comes. Round 5
(`benchmarks/results/AUTOSCALE.md`) put half of pdorch's GPU-hours above the oracle on the Azure
prefix on those projections: the opening ramp's Holt trend projected 103-114 rps at 50-55 s (the
1.5x `trend_cap`) where ~70 came, and each projection then held the pool for the whole 180 s
`scale_down_s` window after the load it forecast had not come. Both rules are off by default.

1. `TrendAge` (**trend age**): the projection is the level plus the projected growth over only
   the part of the horizon the trend has been observed:
       rate_ahead = level + (projected - level) * min(1, age / horizon)
   `age` = seconds since the first tick of the current run of ticks whose projected growth is
   positive, counting that tick's own `tick_s` (a trend first seen this tick has age `tick_s`);
   a tick with growth <= 0 ends the run. Why: a trend seen for 30 s is evidence of 30 s of
   growth, not of 120 s more; a ramp that lasts keeps its full projection once it has lasted the
   horizon. No parameters beyond the tick and the horizon.
2. `AheadRelease(ticks)` (**release unmet projections**): each tick's projection is a path from
   the level `L` it was made at to the rate `R` it forecast at `made_at + horizon`:
       path(t) = L + (R - L) * min(1, (t - made_at) / horizon)
   A projection whose path the observed level (the forecaster's level) is below for `ticks`
   consecutive ticks is *released*: its 120 s-ahead floor no longer holds the pool (the floor
   for the load now keeps its own hold). A release sets a **bar** = the highest released path
   value at its release: until the observed level reaches the bar, new ticks project nothing
   (the floor is sized for the load now), so the next noisy projection does not re-order what
   was just released (Round 5's `ahead_hold_s` 0 flapped on Mooncake exactly so); a level at
   or above the bar is the trend re-confirmed, and projections count again. A projection is
   watched as long as the planner's hold could keep it (`keep_s`, its `ahead_hold_s`). The
   planner's `release_after_ticks` is `ticks` (0, the default: off; measured at 3).
"""

from __future__ import annotations

from dataclasses import dataclass


class TrendAge:
    """Rule 1 of the module docstring: damp a projection by how long its trend has lasted."""

    def __init__(self) -> None:
        self._since: float | None = None
        self._last: float | None = None

    def damp(
        self, now: float, level: float, projected: float, horizon_s: float, tick_s: float
    ) -> float:
        """The projected rate with its growth scaled by `min(1, age / horizon_s)`; call once
        per tick (a repeated `now` reuses the tick's age)."""
        growth = projected - level
        if self._last != now:
            self._last = now
            if growth <= 0:
                self._since = None
            elif self._since is None:
                self._since = now
        if growth <= 0 or self._since is None or horizon_s <= 0:
            return projected
        age = now - self._since + tick_s
        return level + growth * min(1.0, age / horizon_s)


@dataclass
class Projection:
    """One tick's projection: made at `made_at` from level `level` to `rate` at `horizon_s`."""

    made_at: float
    level: float
    rate: float
    horizon_s: float
    misses: int = 0
    released: bool = False

    def path(self, now: float) -> float:
        """The level this projection expects at `now` (linear from `level` to `rate`)."""
        if self.horizon_s <= 0:
            return self.rate
        frac = min(1.0, max(0.0, (now - self.made_at) / self.horizon_s))
        return self.level + (self.rate - self.level) * frac


class AheadRelease:
    """Rule 2 of the module docstring: release projections whose load has not come, and do not
    project again until the level reaches what was released."""

    def __init__(self, ticks: int, keep_s: float) -> None:
        if ticks < 1:
            raise ValueError(f"ticks must be >= 1, got {ticks}")
        self.ticks = ticks
        # how long a projection is watched: as long as the planner's hold could keep it
        self.keep_s = keep_s
        self.bar: float | None = None
        self._live: list[Projection] = []

    def observe(self, now: float, level: float) -> None:
        """Count this tick's misses (level below a projection's path) for every projection made
        before `now` and younger than `keep_s`; release those missed `ticks` in a row."""
        if self.bar is not None and level >= self.bar:
            self.bar = None  # re-confirmed: the level reached what was released
        keep: list[Projection] = []
        for p in self._live:
            if p.made_at >= now:
                keep.append(p)
                continue
            expected = p.path(now)
            p.misses = p.misses + 1 if level < expected else 0
            if p.misses >= self.ticks:
                p.released = True
                self.bar = expected if self.bar is None else max(self.bar, expected)
            elif now - p.made_at <= self.keep_s:
                keep.append(p)
        self._live = keep

    @property
    def suppressed(self) -> bool:
        """True while a release's bar stands: new ticks project nothing ahead."""
        return self.bar is not None

    def track(self, projection: Projection) -> Projection:
        """Watch a new projection (only one that grows: a flat one has nothing to release)."""
        if projection.rate > projection.level:
            self._live.append(projection)
        return projection
