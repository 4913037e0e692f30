"""`diurnal`: the Azure conversation trace's requests re-timed to a day-shaped rate, in 2 hours.

A day is compressed to `duration_s` (7200 s). With `x = t / duration_s` in [0, 1) read as the
hour of the day `h = 24·x`, the arrival rate is

    rate(t) = rate_scale · peak_rps · c(h) / max_h c(h)
    c(h) = floor + (1 - floor) · [G(h; 11) + a_e · G(h; 20)],  G(h; mu) = exp(-(h - mu)² / (2 s²))

a 0.2 floor (`night_ratio`) plus two Gaussians: the late-morning peak at 11:00 (amplitude 1)
and the evening peak at 20:00 (amplitude `evening_ratio` 0.85), s = `peak_width_h` 2.5 h. The
curve is divided by its maximum (taken on a 1-minute grid of the day), so the highest rate is
exactly `peak_rps`; at 03:00 it is 0.2 x peak (+0.3 % from the Gaussians' tails), in the
afternoon valley (~15:30) 0.49 x peak, at midnight ending the day 0.39 x peak (the curve is not
wrapped round). Mean over the day: 0.58 x peak (default: ~41,500 requests).

Arrivals are a non-homogeneous Poisson process with that rate, drawn by time rescaling
(unit-rate Poisson points in `Λ(t) = ∫rate` mapped back through `Λ⁻¹`, seeded). Request `i`
takes the ISL/OSL of trace row `(offset + i) mod rows` — the trace read in order from a seeded
offset, wrapping round, so rows are skipped (thinned) when the day has fewer requests than the
trace and repeated when it has more; the ISL/OSL distribution is the trace's. Each request gets
its own content id (`content_id_for("diurnal", seed, i)`): a repeated row is not a prefix hit.
Output length 0 is replayed as 1 token (as `traces.py` does).

`rate_scale` multiplies the rate and keeps the day at `duration_s` (unlike the trace replays,
where it divides arrival times: a study scaling the load must not shorten the day).
Default `peak_rps` 10.0 (the Azure conversation trace itself averages 5.5 req/s over its hour).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from benchmarks.workloads.model import Segment, SessionSpec, TurnSpec, Workload, content_id_for
from benchmarks.workloads.sampling import rng_for
from benchmarks.workloads.traces import AZURE_CONVERSATION, load_azure

NAME = "diurnal"

_MORNING_H = 11.0
_EVENING_H = 20.0
_GRID_PER_DAY = 24 * 60  # the curve's maximum is taken on a 1-minute grid of the day


class DiurnalParams(BaseModel):
    """Parameters of `diurnal` (names are the `load_workload(**kw)` keys)."""

    model_config = ConfigDict(extra="forbid")

    duration_s: float = Field(7200.0, gt=0.0, description="Length of the compressed day.")
    peak_rps: float = Field(10.0, gt=0.0, description="Arrival rate at the highest peak.")
    night_ratio: float = Field(0.2, gt=0.0, lt=1.0, description="Floor of the curve / peak.")
    evening_ratio: float = Field(0.85, gt=0.0, le=1.0, description="Evening peak amplitude.")
    peak_width_h: float = Field(2.5, gt=0.0, le=12.0, description="Gaussian sigma, day hours.")
    trace: str = Field(str(AZURE_CONVERSATION), description="Azure-format CSV for ISL/OSL.")


def _shape(hours: np.ndarray, p: DiurnalParams) -> np.ndarray:
    def bump(mu: float) -> np.ndarray:
        return np.asarray(np.exp(-((hours - mu) ** 2) / (2.0 * p.peak_width_h**2)))

    peaks = bump(_MORNING_H) + p.evening_ratio * bump(_EVENING_H)
    return np.asarray(p.night_ratio + (1.0 - p.night_ratio) * peaks)


def rate_curve(t_s: np.ndarray | float, p: DiurnalParams, rate_scale: float = 1.0) -> np.ndarray:
    """Arrival rate (req/s) at times `t_s` (seconds from the start of the compressed day)."""
    grid = np.arange(_GRID_PER_DAY + 1) * (24.0 / _GRID_PER_DAY)
    top = float(_shape(grid, p).max())
    hours = 24.0 * np.asarray(t_s, dtype=float) / p.duration_s
    return np.asarray(rate_scale * p.peak_rps * _shape(hours, p) / top)


def arrival_times(p: DiurnalParams, seed: int, rate_scale: float = 1.0) -> np.ndarray:
    """Seeded NHPP arrivals on [0, duration_s) following `rate_curve` (time rescaling)."""
    # Λ on a fine grid (trapezoid), then invert it by interpolation: Λ is strictly increasing
    # because the rate never drops below the floor.
    n_grid = 20_000
    t = np.linspace(0.0, p.duration_s, n_grid + 1)
    r = rate_curve(t, p, rate_scale)
    lam = np.concatenate([[0.0], np.cumsum((r[1:] + r[:-1]) * 0.5 * np.diff(t))])
    rng = rng_for(seed, 0xD1)
    total = float(lam[-1])
    # Enough unit-rate gaps to pass Λ_total with overwhelming probability, then cut.
    n_draw = int(total + 10.0 * math.sqrt(total) + 100)
    points = np.cumsum(rng.exponential(1.0, n_draw))
    while points[-1] < total:  # pragma: no cover - needs a ~10-sigma shortfall
        points = np.concatenate([points, points[-1] + np.cumsum(rng.exponential(1.0, n_draw))])
    points = points[points < total]
    return np.asarray(np.interp(points, lam, t))


def build(*, seed: int = 0, rate_scale: float = 1.0, **kw: object) -> Workload:
    p = DiurnalParams.model_validate(kw)
    trace = load_azure(Path(p.trace))
    lengths = [(s.turns[0].new_tokens, s.turns[0].output_tokens) for s in trace.sessions]
    times = arrival_times(p, seed, rate_scale)
    offset = int(rng_for(seed, 0xD2).integers(len(lengths)))
    sessions: list[SessionSpec] = []
    for i, start in enumerate(times.tolist()):
        isl, osl = lengths[(offset + i) % len(lengths)]
        seg = Segment(content_id_for(NAME, seed, i), isl)
        sessions.append(
            SessionSpec(f"diurnal/s{seed}/{i}", start, [TurnSpec([seg], osl)], carry_context=False)
        )
    return Workload(
        name=NAME,
        sessions=sessions,
        concurrency=None,
        meta={
            "params": p.model_dump(),
            "seed": seed,
            "rate_scale": rate_scale,
            "trace_rows": len(lengths),
            "trace_offset": offset,
            "formula": "c(h) = f + (1-f)*(G(h;11,s) + a_e*G(h;20,s)), rate = peak*c/max c",
        },
    )
