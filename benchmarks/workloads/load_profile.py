"""Per-minute load profile of a workload: requests/min, prefill tokens/min, peak/mean ratios.

Counts the open-loop arrivals only (turn 0 of each session with a `start_s`; later turns and
closed-loop sessions have no arrival time before a run). Prefill tokens of a request = its full
prompt (`prompt_tokens(0)`), no prefix-cache credit: the load a planner must provision for in
the worst case. Bins are `bin_s` (60 s) wide from t = 0; the mean is over the full bins (a
partial last bin would drag it down) unless the run is shorter than one bin.

    peak_mean_ratio = max over bins / mean over bins          (requests and prefill tokens)

Used to say how bursty a trace is ("Azure per-minute prefill load peaks at 1.9x its mean") and
to size a study: `rate_scale_for(profile, tokens_per_s)` = the scale at which the peak bin's
prefill rate equals `tokens_per_s` (e.g. 8 replicas' worth of prefill throughput).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from benchmarks.workloads.model import Workload

__all__ = ["LoadProfile", "load_profile", "rate_scale_for"]


@dataclass(frozen=True, slots=True)
class LoadProfile:
    bin_s: float
    requests: list[int]  # per bin
    prefill_tokens: list[int]  # per bin
    output_tokens: list[int]  # per bin
    full_bins: int  # bins the means are taken over

    @property
    def mean_requests(self) -> float:
        return _mean(self.requests[: self.full_bins])

    @property
    def mean_prefill_tokens(self) -> float:
        return _mean(self.prefill_tokens[: self.full_bins])

    @property
    def requests_peak_mean_ratio(self) -> float:
        return _ratio(max(self.requests, default=0), self.mean_requests)

    @property
    def prefill_peak_mean_ratio(self) -> float:
        return _ratio(max(self.prefill_tokens, default=0), self.mean_prefill_tokens)

    @property
    def peak_prefill_tokens_per_s(self) -> float:
        return max(self.prefill_tokens, default=0) / self.bin_s

    def as_dict(self) -> dict[str, float | int]:
        """The summary numbers (what a report prints)."""
        return {
            "bin_s": self.bin_s,
            "bins": len(self.requests),
            "mean_requests_per_bin": self.mean_requests,
            "peak_requests_per_bin": max(self.requests, default=0),
            "requests_peak_mean_ratio": self.requests_peak_mean_ratio,
            "mean_prefill_tokens_per_bin": self.mean_prefill_tokens,
            "peak_prefill_tokens_per_bin": max(self.prefill_tokens, default=0),
            "prefill_peak_mean_ratio": self.prefill_peak_mean_ratio,
        }


def _mean(xs: list[int]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _ratio(peak: float, mean: float) -> float:
    return peak / mean if mean > 0 else 0.0


def load_profile(workload: Workload, bin_s: float = 60.0) -> LoadProfile:
    """Bin the workload's open-loop arrivals (see the module docstring)."""
    if bin_s <= 0:
        raise ValueError(f"bin_s must be > 0, got {bin_s}")
    arrivals = [
        (s.start_s, s.prompt_tokens(0), s.turns[0].output_tokens)
        for s in workload.sessions
        if s.start_s is not None and s.turns
    ]
    if not arrivals:
        return LoadProfile(bin_s, [], [], [], 0)
    end = max(t for t, _, _ in arrivals)
    n_bins = int(end // bin_s) + 1
    reqs = [0] * n_bins
    pre = [0] * n_bins
    out = [0] * n_bins
    for t, p, o in arrivals:
        b = int(t // bin_s)
        reqs[b] += 1
        pre[b] += p
        out[b] += o
    full = max(1, math.floor(end / bin_s)) if n_bins > 1 else 1
    return LoadProfile(bin_s, reqs, pre, out, full)


def rate_scale_for(profile: LoadProfile, tokens_per_s: float) -> float:
    """Rate scale at which the peak bin's prefill rate equals `tokens_per_s`."""
    peak = profile.peak_prefill_tokens_per_s
    if peak <= 0:
        raise ValueError("the profile has no prefill load")
    return tokens_per_s / peak
