"""Seeded samplers shared by the synthetic workloads (numpy PCG64; one stream per purpose)."""

from __future__ import annotations

import numpy as np


def rng_for(seed: int, *stream: int) -> np.random.Generator:
    """An independent generator for `(seed, *stream)`: adding a stream never shifts another."""
    return np.random.default_rng([seed, *stream])


def lognormal_int(
    rng: np.random.Generator, median: float, sigma: float, lo: int, hi: int, size: int
) -> list[int]:
    """`size` integers from a lognormal with this median (= e^mu) and sigma, clipped to [lo, hi]."""
    x = rng.lognormal(np.log(median), sigma, size)
    return [int(v) for v in np.clip(np.rint(x), lo, hi)]


def lognormal_float(
    rng: np.random.Generator, median: float, sigma: float, hi: float, size: int
) -> list[float]:
    """`size` floats from a lognormal with this median and sigma, capped at `hi` (0 if median 0)."""
    if median <= 0.0:
        return [0.0] * size
    x = rng.lognormal(np.log(median), sigma, size)
    return [float(v) for v in np.minimum(x, hi)]


def poisson_arrivals(rng: np.random.Generator, rate: float, n: int) -> list[float]:
    """`n` Poisson arrival times at `rate` per second, the first at 0."""
    gaps = rng.exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return [float(t) for t in np.cumsum(gaps)]
