"""The oracle's decode count with `perf_model.decode_burst_queue`: the trace's own sequences in
flight, counted, not estimated (`autoscale/sizing.py`'s burst quantile is the estimate).

Each request `i` of the trace enters its decode replica at `e_i = a_i + t_i`, `t_i =
min(perf.prefill_time_s(ISL_i·(1 - hit_i)), TTFT)` (its own prefill, as `size_window`'s
`T_ttft`), and leaves at `e_i + OSL_i·D`, `D = sizing.packed_step_s` the step of the packed
batch `B = perf.decode_max_batch(ctx, ITL)` at the interval's window context `ctx = ISL +
OSL/2`. The count at `e_i` is the requests `j` with `e_j <= e_i < e_j + OSL_j·D` (itself
included): what a replica set must hold for `i` to start decoding at once. The need for the
interval `[start, end)` is `ceil(c_q / B)`, `c_q` the `q`-quantile (the TTFT percentile) of the
counts at the entries of the interval's arrivals, at least the count in flight at `start`.
Requests that arrived up to `lookback_s` before `start` are counted in flight (their exits
may fall in the interval). Pure; `jobs` sorted by arrival.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence

DecodeJob = tuple[float, float, int]  # (arrival_s, own prefill t_i, OSL_i)


def decode_in_flight_quantile(
    jobs: Sequence[DecodeJob],
    arrivals: Sequence[float],
    start_s: float,
    end_s: float,
    step_s: float,
    q: float,
    lookback_s: float,
) -> float:
    """`max(c_q, in flight at start_s)` of the module docstring (sequences, not replicas)."""
    lo = bisect.bisect_left(arrivals, start_s - lookback_s)
    hi = bisect.bisect_left(arrivals, end_s)
    entries = sorted((a + t, a >= start_s, a + t + osl * step_s) for a, t, osl in jobs[lo:hi])
    exits: list[float] = []
    counts: list[int] = []
    at_start = -1
    for e, counted, x in entries:
        if at_start < 0 and e >= start_s:
            at_start = sum(1 for y in exits if y > start_s)
        while exits and exits[0] <= e:
            heapq.heappop(exits)
        heapq.heappush(exits, x)
        if counted:
            counts.append(len(exits))
    if at_start < 0:
        at_start = sum(1 for y in exits if y > start_s)
    if not counts:
        return float(at_start)
    counts.sort()
    k = min(len(counts) - 1, max(0, math.ceil(q * len(counts)) - 1))
    return float(max(counts[k], at_start))
