"""Observed p90 TTFT / ITL per pool over the last minute, from the coordinator's own requests.

`pdorch scale status` shows each pool's observed latency against its SLO. When no autoscaler
reports it (`ScalingControl.observed`, sent with each decision), the coordinator fills it in
from the same observations its request histograms take (`metrics.py`:
`pdorch_time_to_first_token_seconds`, `pdorch_inter_token_latency_seconds`, the same
buckets), kept per pool in a rolling window:

- **window**: the last `window_s` (60 s) in `slots` (6) slots of `window_s / slots` (10 s);
  a read covers the current, partly filled slot and the 5 before it, i.e. between 50 and
  60 s of observations. Reads change nothing (any number of `scale status` clients see the
  same window).
- **p90**: `autoscale.metrics_sources.histogram.CumulativeHistogram.quantile(0.9)` over the
  window's bucket counts, the rule PromQL's `histogram_quantile` follows (exact to within
  one bucket); `None` when the window holds no observation.
- **which metric per pool**: TTFT for the prefill pool (requests whose prompt it computed),
  ITL (each completed stream's mean gap) for the decode pool; both for any other pool
  (colocated replicas compute the prompt and decode). A decode replica that prefilled
  locally (`local` / `fallback` routes) observes TTFT too, but the decode pool is sized on
  ITL, so its row shows ITL.

Cost on the request path: one bisect and a few integer operations per observation.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence

from autoscale.metrics_sources.histogram import CumulativeHistogram

WINDOW_S = 60.0
SLOTS = 6
TTFT_POOLS = frozenset({"prefill"})  # pools whose row shows TTFT only
ITL_POOLS = frozenset({"decode"})  # pools whose row shows ITL only


class RollingHistogram:
    """Bucket counts of the observations of the last `window_s` (module docstring)."""

    def __init__(
        self, bounds: Sequence[float], window_s: float = WINDOW_S, slots: int = SLOTS
    ) -> None:
        if window_s <= 0 or slots < 1:
            raise ValueError("window_s must be > 0 and slots >= 1")
        self.bounds = tuple(float(b) for b in bounds)
        self.slot_s = window_s / slots
        self.window_s = window_s
        # slot index (floor(now / slot_s)) → per-bucket counts (+Inf last) and sum
        self._slots: dict[int, tuple[list[int], list[float]]] = {}
        self._keep = slots

    def observe(self, value: float, now: float) -> None:
        index = math.floor(now / self.slot_s)
        slot = self._slots.get(index)
        if slot is None:
            slot = ([0] * (len(self.bounds) + 1), [0.0])
            self._slots[index] = slot
            for old in [i for i in self._slots if i <= index - self._keep]:
                del self._slots[old]
        slot[0][bisect.bisect_left(self.bounds, value)] += 1
        slot[1][0] += value

    def window(self, now: float) -> CumulativeHistogram:
        """The last window's observations as one cumulative histogram."""
        index = math.floor(now / self.slot_s)
        counts = [0] * (len(self.bounds) + 1)
        total = 0.0
        for i, (slot, sum_) in self._slots.items():
            if index - self._keep < i <= index:
                counts = [a + b for a, b in zip(counts, slot, strict=True)]
                total += sum_[0]
        cumulative: list[float] = []
        running = 0
        for n in counts:
            running += n
            cumulative.append(float(running))
        return CumulativeHistogram((*self.bounds, math.inf), tuple(cumulative), total)


class RecentLatency:
    """Per pool, rolling TTFT and ITL histograms (module docstring)."""

    def __init__(
        self,
        ttft_bounds: Sequence[float],
        itl_bounds: Sequence[float],
        clock: Callable[[], float],
        window_s: float = WINDOW_S,
        slots: int = SLOTS,
    ) -> None:
        self.ttft_bounds = tuple(ttft_bounds)
        self.itl_bounds = tuple(itl_bounds)
        self.clock = clock
        self.window_s = window_s
        self.slots = slots
        self._ttft: dict[str, RollingHistogram] = {}
        self._itl: dict[str, RollingHistogram] = {}

    def _of(
        self, table: dict[str, RollingHistogram], pool: str, bounds: tuple[float, ...]
    ) -> RollingHistogram:
        rolling = table.get(pool)
        if rolling is None:
            rolling = table[pool] = RollingHistogram(bounds, self.window_s, self.slots)
        return rolling

    def first_token(self, pool: str, seconds: float) -> None:
        self._of(self._ttft, pool, self.ttft_bounds).observe(seconds, self.clock())

    def stream_itl(self, pool: str, mean_gap_s: float) -> None:
        self._of(self._itl, pool, self.itl_bounds).observe(mean_gap_s, self.clock())

    def p90(self, pool: str) -> dict[str, float | int | None]:
        """`ttft_p90_s` / `ttft_samples` and `itl_p90_s` / `itl_samples` of `pool`'s metric(s)
        over the window (p90 None when it holds none; both None for the metric the pool's row
        does not show)."""
        now = self.clock()
        out: dict[str, float | int | None] = {}
        for name, table, shown in (
            ("ttft", self._ttft, pool not in ITL_POOLS),
            ("itl", self._itl, pool not in TTFT_POOLS),
        ):
            rolling = table.get(pool) if shown else None
            window = rolling.window(now) if rolling is not None else None
            p90 = window.quantile(0.9) if window is not None else None
            out[f"{name}_p90_s"] = round(p90, 6) if p90 is not None else None
            out[f"{name}_samples"] = round(window.count) if window is not None else 0
            if not shown:
                out[f"{name}_samples"] = None
        return out
