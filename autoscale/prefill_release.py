"""The prefill pool's way down after a peak (planner option `prefill_floor_hold_s`; off by
default: 60 s won on the three short workloads but flapped prefill on the whole Azure hour,
13 direction changes, 4 in its worst 10 minutes, `benchmarks/results/autoscale-round13-whole/`):
a shorter hold of the predictive floors once the load has fallen from its peak.

Rule: each tick records the floor's level rate `L` (the forecaster's level, `autoscale.
predictive_floor`). While `L <= (1 - PEAK_DROP)·max(L over the last floor_hold_s)`, the prefill
pool's fast way down (`autoscale.stabilization`, `sustained-fit`) holds its floors for the load
now and `startup_s` ahead for `prefill_floor_hold_s` only, not `floor_hold_s` / `ahead_hold_s`
(180 s by default); otherwise (flat night, a ramp, a peak's plateau) it holds them as before.
The fit check is unchanged: the pool goes down only to a count every tick of the last
`fast_down_s` found the observed load to fit with `margin`, so N-1 still meets the SLO with
margin; decode is untouched.

Why: on the 600 s diurnal day (burst policy, leg fit) the prefill pool held 6 replicas from
~300 to 480 s while its floor for the load now asked 2-3 (Round 12,
`benchmarks/results/autoscale-round12-fit/`): the floors for the load 120 s ahead of the
peak's ticks (270-290 s, need 5.9) bound the way down for the whole 180 s, and most of those
replicas became ready only after the peak. A planner-wide `floor_hold_s` 60 (both pools, every
tick) let prefill drop to 1 replica at night and miss the ramp's minute 4 (84.08 %), so the short
hold is gated on the fall from a peak. `PEAK_DROP` 0.25: a fall larger than the level's noise
at night (the day's 5 s arrival counts at ~18 rps vary by about +-10 %; the Holt level, half of
that).
Source: pdorch's own measurement (Round 13, `benchmarks/results/autoscale-round13-prefill/`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

PEAK_DROP = 0.25  # the fall from the window's peak level that makes a tick "after the peak"


@dataclass
class PeakRelease:
    """The prefill pool's hold after a peak (module docstring); `observe` once per tick."""

    hold_s: float  # `prefill_floor_hold_s`: the floors' hold after the peak
    window_s: float  # the peak is the largest level of this long (the pool's `floor_hold_s`)
    drop: float = PEAK_DROP
    _levels: deque[tuple[float, float]] = field(default_factory=deque)

    def observe(self, now: float, level_rps: float) -> float | None:
        """This tick's hold of the floors: `hold_s` after the peak, None (the pool's own
        windows) otherwise."""
        levels = self._levels
        levels.append((now, level_rps))
        while levels and now - levels[0][0] > self.window_s:
            levels.popleft()
        peak = max(v for _, v in levels)
        return self.hold_s if peak > 0 and level_rps <= (1.0 - self.drop) * peak else None
