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

**KV tokens in flight** (`decode_kv_in_flight_quantile`, 2026-12-02): the same entries, each
sequence weighted by the KV it holds, `ISL_j + OSL_j/2` tokens (its prompt plus, on average
over its residence, half its answer). The oracle's decode need is the larger of the count over
`B` and the token quantile over a replica's usable KV pool. Why: `B` is KV-capped at the
window's *mean* context, but long prompts arrive together; on the whole Mooncake trace x2 the
p99 of the tokens in flight asks 2.4-3.4 replicas' KV where the count over `B` asks 1.8-2.6,
and the count alone held 83.8 % within both there (94.2 % with the default model). Where
decode is bound by `max_num_seqs` (Azure, the diurnal day: 1-1.5k contexts), the token term
never binds.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterator, Sequence

DecodeJob = tuple[float, float, int]  # (arrival_s, own prefill t_i, OSL_i)


def _in_flight_at_entries(
    jobs: Sequence[DecodeJob],
    weights: Sequence[float] | None,
    arrivals: Sequence[float],
    start_s: float,
    end_s: float,
    step_s: float,
    lookback_s: float,
) -> tuple[list[float], float]:
    """(the weight in flight at each counted entry, the weight in flight at `start_s`); weight
    1 per sequence when `weights` is None."""
    lo = bisect.bisect_left(arrivals, start_s - lookback_s)
    hi = bisect.bisect_left(arrivals, end_s)

    def weight(k: int) -> float:
        return 1.0 if weights is None else weights[k]

    entries = sorted(
        (a + t, a >= start_s, a + t + osl * step_s, weight(lo + k))
        for k, (a, t, osl) in enumerate(jobs[lo:hi])
    )
    exits: list[tuple[float, float]] = []  # (exit time, weight), a min-heap
    held = 0.0
    counts: list[float] = []
    at_start: float | None = None

    def left_after(t: float) -> Iterator[float]:
        return (w for x, w in exits if x > t)

    for e, counted, x, w in entries:
        if at_start is None and e >= start_s:
            at_start = sum(left_after(start_s))
        while exits and exits[0][0] <= e:
            held -= heapq.heappop(exits)[1]
        heapq.heappush(exits, (x, w))
        held += w
        if counted:
            counts.append(held)
    if at_start is None:
        at_start = sum(left_after(start_s))
    return counts, at_start


def _quantile_at_least(counts: list[float], at_start: float, q: float) -> float:
    if not counts:
        return at_start
    counts.sort()
    k = min(len(counts) - 1, max(0, math.ceil(q * len(counts)) - 1))
    return max(counts[k], at_start)


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
    counts, at_start = _in_flight_at_entries(
        jobs, None, arrivals, start_s, end_s, step_s, lookback_s
    )
    return float(_quantile_at_least(counts, at_start, q))


def decode_kv_in_flight_quantile(
    jobs: Sequence[DecodeJob],
    kv_tokens: Sequence[float],
    arrivals: Sequence[float],
    start_s: float,
    end_s: float,
    step_s: float,
    q: float,
    lookback_s: float,
) -> float:
    """The same quantile of the KV tokens in flight (`kv_tokens[i]` per job, module
    docstring), at least those in flight at `start_s`."""
    counts, at_start = _in_flight_at_entries(
        jobs, kv_tokens, arrivals, start_s, end_s, step_s, lookback_s
    )
    return _quantile_at_least(counts, at_start, q)
