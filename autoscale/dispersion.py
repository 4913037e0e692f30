"""The burst queue's index of dispersion `I`, learnt from the arrivals the planner sees (pure).

`autoscale/sizing.py`'s burst quantile `S_q = m + z_q·sqrt(I·m)` needs `I`, the variance over
the mean of the arrivals counted over about one decode residence. A fixed `I`
(`perf_model.decode_burst_dispersion`, 16) was fitted to the Azure x14 prefix's busy windows;
the arrivals of other workloads are far less clustered. Counted per 5 s over 300 s windows
(`benchmarks/results/autoscale-round12-decode/`): the Azure x14 prefix 14.6 (14 overlaid
copies of each request within 1 s), the 600 s diurnal day 1.7 (a thinned Poisson day), the
Mooncake x2 trace 2.2-5.3. At 16 the decode floor there asked 3-7 replicas where the oracle,
counting the trace's own sequences, ran ~2.4 on average, and under the shared GPU budget the
excess was taken from prefill.

Estimate (`ArrivalDispersion`, `perf_model.decode_burst_dispersion_online`): the count `n_i`
of each planner window (one reactive tick, 5 s, about one residence at the Azure and day
contexts), over the windows of the last `history_s` (300 s):

    I = max(1, [Σ_i (n_i - n_{i-1})² / (2(K - 1))] / mean(n_i))

the variance from successive differences, so a ramp's trend is not read as dispersion (on
the day's steepest ramp a 5 s count grows ~2.5 requests a window, against a Poisson standard
deviation of ~14 at 40 rps). Until `min_windows` (12, one minute) windows with arrivals are
seen, `I` is the prior (the fixed `decode_burst_dispersion`). Floored at 1 (Poisson: the
quantile of `sizing.burst_quantile` already floors `I` so).
"""

from __future__ import annotations

from collections import deque
from itertools import pairwise


class ArrivalDispersion:
    """Online `I` of the module docstring; `observe` once per planner window."""

    def __init__(self, prior: float, *, history_s: float = 300.0, min_windows: int = 12) -> None:
        if prior < 1 or history_s <= 0 or min_windows < 2:
            raise ValueError("prior >= 1, history_s > 0 and min_windows >= 2 are required")
        self.prior = prior
        self.history_s = history_s
        self.min_windows = min_windows
        self._counts: deque[tuple[float, int]] = deque()  # (window end, arrivals)

    def observe(self, now: float, count: int, window_s: float) -> None:
        """One window's arrivals (windows of no length are skipped)."""
        if window_s <= 0:
            return
        self._counts.append((now, max(0, count)))
        while self._counts and now - self._counts[0][0] >= self.history_s - 1e-9:
            self._counts.popleft()

    def value(self) -> float:
        """`I` now: the estimate, or the prior before `min_windows` windows with arrivals."""
        n = [c for _t, c in self._counts]
        total = sum(n)
        if len(n) < self.min_windows or total <= 0:
            return self.prior
        mean = total / len(n)
        diff_var = sum((b - a) ** 2 for a, b in pairwise(n)) / (2 * (len(n) - 1))
        return max(1.0, diff_var / mean)
