"""The load of a stretch of time, as the clairvoyant and the static planners read it.

`LoadWindow` is what arrived in `[start_s, start_s + duration_s)`: arrival rate, mean prompt and
output length, and the token-weighted prefix-hit rate. A trace is handed to those planners as a
list of `TraceRequest` tuples `(arrival_s, isl_tokens, osl_tokens, prefix_hit_rate)`, or as a
`FutureLoad` callable `(start_s, end_s) -> LoadWindow` (the fleet simulator may pass either;
`future_from_requests` turns the first into the second).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

TraceRequest = tuple[float, int, int, float]  # (arrival_s, isl_tokens, osl_tokens, hit 0..1)


@dataclass(frozen=True, slots=True)
class LoadWindow:
    start_s: float
    duration_s: float
    arrival_rps: float = 0.0
    mean_isl_tokens: float = 0.0
    mean_osl_tokens: float = 0.0
    prefix_hit_rate: float = 0.0  # token-weighted: Σ isl·hit / Σ isl

    @property
    def num_requests(self) -> float:
        return self.arrival_rps * self.duration_s


FutureLoad = Callable[[float, float], LoadWindow]


def window_of(requests: Sequence[TraceRequest], start_s: float, end_s: float) -> LoadWindow:
    """The load of the requests (any order) that arrive in `[start_s, end_s)`."""
    chosen = [r for r in requests if start_s <= r[0] < end_s]
    return _summarise(chosen, start_s, end_s)


def _summarise(chosen: Sequence[TraceRequest], start_s: float, end_s: float) -> LoadWindow:
    duration = max(end_s - start_s, 1e-9)
    if not chosen:
        return LoadWindow(start_s, duration)
    n = len(chosen)
    isl_sum = sum(r[1] for r in chosen)
    hit = sum(r[1] * r[3] for r in chosen) / isl_sum if isl_sum > 0 else 0.0
    return LoadWindow(
        start_s=start_s,
        duration_s=duration,
        arrival_rps=n / duration,
        mean_isl_tokens=isl_sum / n,
        mean_osl_tokens=sum(r[2] for r in chosen) / n,
        prefix_hit_rate=hit,
    )


def future_from_requests(requests: Sequence[TraceRequest]) -> FutureLoad:
    """A `FutureLoad` over a trace (sorted once; each query is a bisection)."""
    ordered = sorted(requests, key=lambda r: r[0])
    times = [r[0] for r in ordered]

    def future(start_s: float, end_s: float) -> LoadWindow:
        lo = bisect.bisect_left(times, start_s)
        hi = bisect.bisect_left(times, end_s)
        return _summarise(ordered[lo:hi], start_s, end_s)

    return future


def split_windows(requests: Sequence[TraceRequest], window_s: float) -> list[LoadWindow]:
    """The trace cut into consecutive windows of `window_s` from its first arrival."""
    if not requests:
        return []
    future = future_from_requests(requests)
    first = min(r[0] for r in requests)
    last = max(r[0] for r in requests)
    out: list[LoadWindow] = []
    start = first
    while start <= last:
        out.append(future(start, start + window_s))
        start += window_s
    return out


def mean_window(windows: Sequence[LoadWindow]) -> LoadWindow:
    """The time-weighted mean load of `windows` (lengths and hit weighted by requests/tokens)."""
    total_s = sum(w.duration_s for w in windows)
    reqs = sum(w.num_requests for w in windows)
    if total_s <= 0 or reqs <= 0:
        return LoadWindow(windows[0].start_s if windows else 0.0, max(total_s, 1e-9))
    isl_tok = sum(w.num_requests * w.mean_isl_tokens for w in windows)
    return LoadWindow(
        start_s=windows[0].start_s,
        duration_s=total_s,
        arrival_rps=reqs / total_s,
        mean_isl_tokens=isl_tok / reqs,
        mean_osl_tokens=sum(w.num_requests * w.mean_osl_tokens for w in windows) / reqs,
        prefix_hit_rate=(
            sum(w.num_requests * w.mean_isl_tokens * w.prefix_hit_rate for w in windows) / isl_tok
            if isl_tok > 0
            else 0.0
        ),
    )
