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

**Hysteresis** (`hysteresis` h, `window_s`): the planner gives each tick three counts of the
same need (its predictive floor's; the reactive terms are never banded: they are observed
need, and a breach): raw `ceil(need)`, hold `ceil(need·(1 + h))` and up `ceil(need/(1 + h))`.
Within `window_s` after the pool last went **up**, both ways down read the hold counts; within
`window_s` after it last went **down**, the way up reads the up count. So a pool that went up to
`N` comes back to `N-1` only once the need has stayed at or below `(N-1)/(1 + h)` for the
window, and a pool that went down to `N` goes back to `N+1` only once the need passes
`N·(1 + h)`: a Schmitt trigger on the reversal, the one move that makes a flap. Outside the
window each way reads the raw count, as without hysteresis (`h` 0). Why the up side too: with
the way down alone banded (10 %), the 2-hour day's decode pool still went 6 -> 5 -> 6 within
10 s, its 120 s-ahead floor lifted past 5 by one noisy 5 s window (a Holt trend over ±8 %
arrival noise). The reversal costs a cold start; the pool went down because the need had
stayed under `(N-1)/(1+h)` for a whole window, so a need back over `N·(1+h)` is a real rise of
`(1+h)^2`, and the headroom (0.9) and the unbanded reactive terms cover the band.
Why hysteresis: on the 2-hour
diurnal day's evening plateau the decode floor's need sat at ~5 replicas with noise of a few
percent; the down rule found 5 enough for 180 s, then 20-50 s later the up rule found 6
needed, four times in 12 minutes, each a 120 s cold start (benchmarks/results/AUTOSCALE.md,
"The issue's workloads as named"). `down_band` 0 is the planner without it. Its default lives
with the planner's options (`policy.PlannerOptions`).

**Persistence of a floor-ordered reversal** (`reversal_ticks` N; the class's default 1 is
off, the planner's default 6: Round 9): within `window_s` after the pool went **down**, that
down being its last move, an up the reactive terms do not ask for (their
count `reactive <= current`: the predictive floor alone orders it) happens only on the N-th
consecutive tick whose up count is above the current count; a tick at or below it starts the
count again (reason `persistence` while it waits). An up the reactive terms ask for (an
observed queue, concurrency, KV or a breach above the current count) goes at once, and
outside the window nothing waits (a ramp after a steady stretch is not delayed). Why: on the
2-hour diurnal day each of decode's three up-reversals (4,615, 5,040 and 6,370 s) was ordered
by the floor for the load `startup_s` ahead on 1-4 ticks in a row: a Holt trend over 5 s
windows turned positive on one noisy window (+16-22 % projected over the level) and the
windows' mean OSL moved the need by +-15 % at a flat rate, so the up count passed the band
for 5-20 s and fell back (benchmarks/results/autoscale-round9-flap/README.md). A rise that
stays over the band waits `(N-1)·interval`; one whose need hovers at the band's edge waits
until it clears it (the day's night 1 -> 2 went 170 s later in the replay).

**Reversal budget** (`budget`, planner option `reversal_budget`; None: off): a down that
would be a reversal waits (reason `reversal-budget`) while the pool's reversals of the last
`window_s` leave no room for it and an up at once after it, so no window holds more than
`count` (`autoscale.reversal_budget`, which has the rule and its proof).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from autoscale.projections import Projection
from autoscale.reversal_budget import REASON as BUDGET_REASON
from autoscale.reversal_budget import ReversalBudget
from autoscale.sizing import replicas_for

Consolidate = Callable[[int, int], int]
"""`consolidated(start, current)`: the smallest count in [start, current] the observed load
fits with margin (current when none does)."""


def hold_count(need: float, hysteresis: float) -> int:
    """The count the way down must clear after an up: `ceil(need·(1 + h))`."""
    return replicas_for(need * (1.0 + hysteresis))


def up_count(need: float, hysteresis: float) -> int:
    """The count the way up must pass after a down: `ceil(need/(1 + h))`."""
    return replicas_for(need / (1.0 + hysteresis))


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
    window_s: float = 0.0  # how long after a move the reversal reads the banded counts
    reversal_ticks: int = 1  # consecutive ticks a floor-ordered up after a down must last
    # this tick's shorter hold of the floors on the fast way down (None: `windows`' own; the
    # prefill pool after a peak, `autoscale.prefill_release`); the floors are kept for the
    # windows' whole length either way
    short_hold_s: float | None = None
    # this tick: the floors for the load ahead hold for this tick only (the prefill pool while
    # its trend falls, `autoscale.prefill_down`); the floors for the load now keep their window
    ahead_released: bool = False
    budget: ReversalBudget | None = None  # at most `count` reversals in any `window_s`
    _raw: deque[tuple[float, int]] = field(default_factory=deque)
    _hold: deque[tuple[float, int]] = field(default_factory=deque)
    _fit: deque[tuple[float, int]] = field(default_factory=deque)
    # (tick, its floor for the load now, for the load `startup_s` ahead (each as (raw, hold)
    # counts), the projection behind the latter when `release_after_ticks` watches it)
    _floors: deque[tuple[float, tuple[int, int], tuple[int, int], Projection | None]] = field(
        default_factory=deque
    )
    _last_up: float | None = None
    _last_down: float | None = None
    _streak: int = 0  # consecutive ticks, up to this one, whose up count was above current

    def record_floor(
        self,
        now: float,
        floor_now: tuple[int, int],
        floor_ahead: tuple[int, int],
        projection: Projection | None,
    ) -> None:
        """This tick's floors for the fast way down, each as its (raw, hold) counts."""
        self._floors.append((now, floor_now, floor_ahead, projection))

    def record_move(self, now: float, up: bool) -> None:
        """A role move changed the pool's count (planner option `move_stabilization`): it is a
        move of the pool like a scale, so the reversal rules (hysteresis, persistence) read it."""
        if up:
            self._last_up = now
        else:
            self._last_down = now

    def down_limit(self, now: float) -> int:
        """The fewest replicas the slow way down would leave the pool now: the largest raw
        count (hold count while banded) of the last `scale_down_s` (0 before any tick). A role
        move out of the pool is a way down too (move stabilization, `autoscale.role_moves`)."""
        hist = self._hold if self.banded(now) else self._raw
        w = self.windows.scale_down_s
        return max((r for t, r in hist if now - t <= w), default=0)

    def banded(self, now: float) -> bool:
        """Does the way down read the hold counts now (the pool went up within `window_s`)?"""
        return self._last_up is not None and now - self._last_up <= self.window_s

    def up_banded(self, now: float) -> bool:
        """Does the way up read the up count now (the pool went down within `window_s`)?"""
        return self._last_down is not None and now - self._last_down <= self.window_s

    def reverses_down(self) -> bool:
        """Was the pool's last move a down (so an up now is a direction change)?"""
        return self._last_down is not None and (
            self._last_up is None or self._last_up < self._last_down
        )

    def decide(
        self,
        now: float,
        raw: int,
        hold: int,
        reason: str,
        current: int,
        watched_s: float,
        consolidated: Consolidate,
        up: int | None = None,
        reactive: int | None = None,
    ) -> tuple[int, str]:
        """The pool's count and its reason for this tick; `up <= raw <= hold` (module
        docstring; `up` None: `raw`; `reactive` None: the up is the reactive terms')."""
        up_n = raw if up is None else up
        self._streak = self._streak + 1 if up_n > current else 0
        banded_up = raw > current and self.up_banded(now)
        held = banded_up and up_n <= current
        waits = (
            banded_up
            and not held
            and self.reverses_down()
            and reactive is not None
            and reactive <= current
            and self._streak < self.reversal_ticks
        )
        n, why = self._decide(
            now, current if held or waits else raw, hold, reason, current, watched_s, consolidated
        )
        if held:
            why = "hysteresis"
        elif waits:
            why = "persistence"
        if self.budget is not None:
            self.budget.observe(now, current)
            if n < current and self.budget.refuses(now):
                n, why = current, BUDGET_REASON
        if n > current:
            self._last_up = now
        elif n < current:
            self._last_down = now
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
        floor_s, ahead_s = w.floor_hold_s, w.ahead_hold_s
        if self.short_hold_s is not None:
            floor_s, ahead_s = min(floor_s, self.short_hold_s), min(ahead_s, self.short_hold_s)
        if self.ahead_released:
            ahead_s = 0.0
        for t, now_counts, ahead_counts, proj in self._floors:
            f_now, f_ahead = now_counts[pick], ahead_counts[pick]
            if now - t <= floor_s:
                fast = max(fast, f_now)
            # a released projection (its load did not come) no longer holds the pool
            if now - t <= ahead_s and not (proj is not None and proj.released):
                fast = max(fast, f_ahead)
        return min(current, fast)
