"""One pool's way down (and its wait on the way up): pdorch's planner step 5.

`PoolStabilizer.decide(now, raw, hold, ...)` turns a tick's raw count into the count the pool
is asked for. Pure: every input is an argument, `now` included; the state is the pool's recent
ticks.

- **Up** (`raw >= provisioned`): the minimum raw count of the last `scale_up_s` (0: at once).
- **Slow way down**: the maximum *hold* count of the last `scale_down_s`, only once the planner
  has watched a whole window, and only as far as the smallest count `M` the observed load
  still fits with margin (the consolidation check, `consolidated(start, current)`).
- **Fast way down** (`sustained-fit`): the largest count the fit check found over the last
  `fast_down_s`, never below a floor for the load now of the last `floor_hold_s` nor a floor
  for the load `startup_s` ahead of the last `ahead_hold_s` (a released projection no longer
  holds).

**Hysteresis** (`hold`, `down_band`, `band_window_s`): the up rule reads the raw count
`ceil(need)`; for `band_window_s` after the pool last went up, the way down reads the hold
count `ceil(need·(1 + down_band))` of the same predictive-floor need instead (the planner
computes both; the reactive terms are not banded: they are observed need, and a breach). A
pool that went up to `N` replicas so comes back to `N-1` within that time only once the need
has stayed at or below `(N-1)/(1 + down_band)` for the window: a Schmitt trigger on the
reversal, the one move that makes a flap. Outside it the way down reads the raw count as
before (the band held a replica on Mooncake's flat load, where nothing flapped, and the shared
GPU budget then starved prefill: -0.4 points at 0.1 always on). Why the band: on the 2-hour
diurnal day's evening plateau the decode floor's need sat at ~5 replicas with noise of a few
percent; the down rule found 5 enough for 180 s, then 20-50 s later the up rule found 6
needed, four times in 12 minutes, each a 120 s cold start (benchmarks/results/AUTOSCALE.md,
"The issue's workloads as named"). `down_band` 0 is the planner without it. Its default lives
with the planner's options (`policy.PlannerOptions`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from autoscale.projections import Projection
from autoscale.sizing import replicas_for

Consolidate = Callable[[int, int], int]
"""`consolidated(start, current)`: the smallest count in [start, current] the observed load
fits with margin (current when none does)."""


def hold_count(need: float, down_band: float) -> int:
    """The count the way down must clear: `ceil(need·(1 + down_band))`."""
    return replicas_for(need * (1.0 + down_band))


@dataclass(frozen=True)
class Windows:
    """The stabilization windows (seconds) one pool's decisions read."""

    scale_up_s: float
    scale_down_s: float
    fast_down_s: float
    floor_hold_s: float
    ahead_hold_s: float


@dataclass
class PoolStabilizer:
    """One pool's recent ticks and the step-5 decision over them (module docstring)."""

    windows: Windows
    band_window_s: float | None = None  # None: the band always applies
    _raw: deque[tuple[float, int]] = field(default_factory=deque)
    _hold: deque[tuple[float, int]] = field(default_factory=deque)
    _fit: deque[tuple[float, int]] = field(default_factory=deque)
    # (tick, its floor for the load now, for the load `startup_s` ahead (each as (raw, hold)
    # counts), the projection behind the latter when `release_after_ticks` watches it)
    _floors: deque[tuple[float, tuple[int, int], tuple[int, int], Projection | None]] = field(
        default_factory=deque
    )
    _last_up: float | None = None

    def record_floor(
        self,
        now: float,
        floor_now: tuple[int, int],
        floor_ahead: tuple[int, int],
        projection: Projection | None,
    ) -> None:
        """This tick's floors for the fast way down, each as its (raw, hold) counts."""
        self._floors.append((now, floor_now, floor_ahead, projection))

    def banded(self, now: float) -> bool:
        """Does the way down read the hold counts now (module docstring)?"""
        if self.band_window_s is None:
            return True
        return self._last_up is not None and now - self._last_up <= self.band_window_s

    def decide(
        self,
        now: float,
        raw: int,
        hold: int,
        reason: str,
        current: int,
        watched_s: float,
        consolidated: Consolidate,
    ) -> tuple[int, str]:
        """The pool's count and its reason for this tick; `hold >= raw` (module docstring)."""
        n, why = self._decide(now, raw, hold, reason, current, watched_s, consolidated)
        if n > current:
            self._last_up = now
        return n, why

    def _decide(
        self,
        now: float,
        raw: int,
        hold: int,
        reason: str,
        current: int,
        watched_s: float,
        consolidated: Consolidate,
    ) -> tuple[int, str]:
        w = self.windows
        hold = max(hold, raw)
        keep = max(w.scale_up_s, w.scale_down_s)
        for hist, value in ((self._raw, raw), (self._hold, hold)):
            hist.append((now, value))
            while hist and now - hist[0][0] > keep:
                hist.popleft()
        fit = self._fit
        fit.append((now, raw if raw >= current else consolidated(raw, current)))
        while fit and now - fit[0][0] > w.fast_down_s:
            fit.popleft()
        floors = self._floors
        while floors and now - floors[0][0] > max(w.floor_hold_s, w.ahead_hold_s):
            floors.popleft()
        if raw >= current:
            if w.scale_up_s <= 0:
                return raw, reason
            up = min(r for t, r in self._raw if now - t <= w.scale_up_s)
            target = max(current, up)
            return target, reason if target == raw else "stabilization"
        fast = self._fast_down(now, current, watched_s)
        if watched_s < w.scale_down_s:
            if fast < current:
                return fast, "sustained-fit"
            return current, "stabilization"
        hist = self._hold if self.banded(now) else self._raw
        down = min(current, max(r for t, r in hist if now - t <= w.scale_down_s))
        slow = current if down >= current else consolidated(down, current)
        if fast < slow:
            return fast, "sustained-fit"
        if slow >= current:
            return current, "stabilization"
        if slow > down:
            return slow, "consolidation"
        return down, reason if down == raw else "stabilization"

    def _fast_down(self, now: float, current: int, watched_s: float) -> int:
        """The count every tick of the last `fast_down_s` found the observed load fits (and the
        raw need allowed at that tick), never below the hold floors of their windows. The
        windows guard against forecast noise; it is the backlog and breach terms' transient
        high-water mark that the fit check may skip."""
        w = self.windows
        if w.fast_down_s <= 0 or watched_s < w.fast_down_s:
            return current
        fast = max(c for _, c in self._fit)
        pick = 1 if self.banded(now) else 0
        for t, now_counts, ahead_counts, proj in self._floors:
            f_now, f_ahead = now_counts[pick], ahead_counts[pick]
            if now - t <= w.floor_hold_s:
                fast = max(fast, f_now)
            # a released projection (its load did not come) no longer holds the pool
            if now - t <= w.ahead_hold_s and not (proj is not None and proj.released):
                fast = max(fast, f_ahead)
        return min(current, fast)
