"""The prefill pool's own way down (planner options `prefill_scale_down_s`,
`prefill_fall_release` and `prefill_fit_margin`; all off by default, Round 15).

**Prefill scale-down window** (`prefill_scale_down_s` W, default 90 s since Round 16; null:
`stabilization.scale_down_s`, the planner-wide 180 s; W is never longer than that window):
the prefill pool's `autoscale.stabilization.Windows` read W for the
slow way down and bound the fast way down's floor holds by it:
`Windows(scale_up_s, W, fast_down_s, min(floor_hold_s, W), min(ahead_hold_s, W))`.
Decode keeps the planner's windows. The fit check (N-1 meets the SLO with `margin` over the
last `fast_down_s`, `planner_terms.fits`), hysteresis and persistence are unchanged, so a
shorter window releases only a replica the observed load has not needed for `fast_down_s`
and that no floor of the last W asks for. Why: 180 s is a decode-sized window (a decode
replica carries sequences for `OSL·ITL`, ~10 s each, and a 300 s drain); a prefill replica's
legs last ~0.1-1 s, so it is empty within seconds of leaving, while the window held the
floors of a peak's ticks (the ramp projected up to `trend_cap` 1.5x the level) for 180 s
after the peak (Azure x14 prefix: prefill 0.26 GPU-h above the oracle in holds after peaks,
0.26 in ramps, of a 0.85 gap). Measured (Round 15, default -> W 90 at the same attainment):
Azure x14 prefix 0.940x the GPU-hours (prefill 0.890x), 600 s day 0.917x (prefill direction
changes 1 -> 2 in its 10 minutes), Mooncake prefix identical; W 60 re-ordered inside a burst
(3 direction changes), W 120 0.964x / 0.950x. Whole workloads (with the learnt decode spare,
`benchmarks/results/autoscale-round15-whole/`): W 90 0.912x on the Azure hour, 0.964x on the
2-hour day, whole Mooncake identical, at equal attainment, with 3 prefill direction changes in
the hour's worst 10 minutes (W 120: 4): each follows one of the hour's bursts 5-15 min apart,
while the goal's steady segments (whole Mooncake 0, the day 2) hold <= 2. A reversal budget
that keeps <= 2 on the hour too (`autoscale/reversal_budget.py`) cost 1.042x the old default
there (Round 16). Default since Round 16 (`benchmarks/results/autoscale-round16-flap/`).

**Release of the ahead floors on a sustained fall** (`prefill_fall_release`, bool): each tick
records the forecaster's raw growth at `startup_s` ahead relative to the level,
`g = (rate(startup_s) - L) / L`; while its mean over the last `trend_hold_s` is at most
`-FALL` (0.1), the prefill pool's fast way down holds the floors for the load `startup_s`
ahead of this tick only (`PoolStabilizer.ahead_released`), not those of the last
`ahead_hold_s`; the floors for the load now keep their window. Why: those floors forecast
the load one cold start ahead; once the trend says the load is leaving, an earlier tick's
forecast of growth is contradicted and holding it only pays for replicas the load has left.
`FALL` 0.1: beyond the noise of a Holt trend over 5 s windows (Azure x14 projects +-18 % per
window, `predictive_floor._sustained`; its 30 s mean a third of that). Measured: 0.967x /
0.970x the GPU-hours on the Azure prefix / 600 s day, no direction change added; with W 90 it
adds a direction change on the day and saves less than W 90 alone.

**Prefill fit margin** (`prefill_fit_margin` m_p; null: the planner's `margin`, 0.8): the
prefill pool's consolidation check (`planner_terms.fits`: `λ_tok <= m_p·M·C_p/k` and
`t_own + (Q/M)/(μ/k) <= m_p·TTFT`) reads m_p; decode's keeps `margin`. Why: per tick on the
Azure x14 prefix the largest keeper of prefill replicas above the floor for the load now is
this check refusing N-1 (0.27 of 0.64 replica-hours): at 0.8 it asks for more than the floor
sizes at `headroom` 0.9, so a count the floor calls enough cannot be reached on the way down
until a whole `fast_down_s` of 5 s windows, noisy ones included, fits 0.8. Measured, 0.9 did
nothing (Azure prefix 0.9994x the GPU-hours, the 600 s day identical): what holds is the fit
minute's noisiest window, which N-1 would not carry at 0.9 either; kept off.

Source: pdorch's own measurement (Round 15, `benchmarks/results/autoscale-round15-prefill/`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from autoscale.predictive_floor import PredictiveFloor
from autoscale.prefill_release import PeakRelease
from autoscale.signals import Pool
from autoscale.stabilization import PoolStabilizer, Windows

FALL = 0.1  # the mean relative growth at `startup_s` ahead at or below -FALL is a fall


def prefill_windows(windows: Windows, scale_down_s: float | None) -> Windows:
    """The prefill pool's windows with `prefill_scale_down_s` (None: `windows` unchanged),
    never longer than the planner's own `scale_down_s`: a policy that shortens every pool's
    window (the live example's 30 s) is not lengthened for prefill by the 90 s default."""
    if scale_down_s is None:
        return windows
    scale_down_s = min(scale_down_s, windows.scale_down_s)
    return Windows(
        windows.scale_up_s,
        scale_down_s,
        windows.fast_down_s,
        min(windows.floor_hold_s, scale_down_s),
        min(windows.ahead_hold_s, scale_down_s),
    )


@dataclass
class FallGate:
    """Is the load's trend a sustained fall (module docstring)? `observe` once per tick."""

    window_s: float  # `trend_hold_s`: the growth is averaged over this long
    fall: float = FALL
    _growth: deque[tuple[float, float]] = field(default_factory=deque)

    def observe(self, now: float, level_rps: float, ahead_rps: float) -> bool:
        """True while the mean relative growth of the last `window_s` is <= -`fall`."""
        g = (ahead_rps - level_rps) / level_rps if level_rps > 0 else 0.0
        hist = self._growth
        hist.append((now, g))
        while hist and now - hist[0][0] > self.window_s:
            hist.popleft()
        return sum(v for _, v in hist) / len(hist) <= -self.fall


@dataclass
class PrefillDown:
    """The prefill pool's per-tick rules on its way down: the hold after a peak
    (`prefill_floor_hold_s`, `autoscale.prefill_release`) and the release on a fall (above);
    `apply` sets them on the pool's stabilizer once per tick."""

    peak: PeakRelease | None
    fall: FallGate | None

    @classmethod
    def of(
        cls, peak_hold_s: float | None, floor_hold_s: float, fall: bool, trend_hold_s: float
    ) -> PrefillDown:
        """The rules of the planner's options (`prefill_floor_hold_s`, `prefill_fall_release`)."""
        return cls(
            None if peak_hold_s is None else PeakRelease(peak_hold_s, floor_hold_s),
            FallGate(trend_hold_s) if fall else None,
        )

    def apply(
        self, now: float, floor: PredictiveFloor, stabilizer: PoolStabilizer
    ) -> dict[str, object]:
        """Set this tick's rules on `stabilizer` from `floor`'s level and forecast (the rate
        `startup_s` ahead, read only by the fall rule; none before a whole window); what they
        read, for the decision's details."""
        out: dict[str, object] = {}
        level = floor.level_rps
        if self.peak is not None:
            short = self.peak.observe(now, level)
            stabilizer.short_hold_s = short
            out["prefill_short_hold_s"] = short
        if self.fall is not None:
            horizon = floor.policy.limits(Pool.PREFILL).startup_s
            ahead = floor.forecaster.forecast(horizon)[0] if floor.fed else level
            stabilizer.ahead_released = self.fall.observe(now, level, ahead)
            out["prefill_ahead_released"] = stabilizer.ahead_released
        return out
