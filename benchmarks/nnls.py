"""Exact non-negative least squares for a handful of unknowns (the fits of a few timing-model
overheads: `benchmarks/fidelity_fit.py`, `benchmarks/perf_model_fit.py`).

    min ||a·x - b||²  subject to  x ≥ 0

The optimum is the unconstrained least-squares optimum on its own support (the set of nonzero
x_i), so every support is tried: 2^n lstsq solves, exact and cheap for the 4 unknowns of these
fits, with nothing beyond numpy.
"""

from __future__ import annotations

import numpy as np


def nnls_exact(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    """(x, sum of squared residuals) of the best non-negative `x`; see the module docstring."""
    best: tuple[np.ndarray, float] | None = None
    cols = a.shape[1]
    for mask in range(1 << cols):
        free = [i for i in range(cols) if mask >> i & 1]
        x = np.zeros(cols)
        if free:
            sol, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
            if (sol < 0).any():
                continue
            x[free] = sol
        sse = float(np.sum((a @ x - b) ** 2))
        if best is None or sse < best[1]:
            best = (x, sse)
    assert best is not None
    return best
