"""Figures of `kill-coordinator` (pure: no I/O, no clock): two coordinators' token load against
each other, and the killed one's requests by phase.

Token load difference (`load_difference`): for two `/admin/pools` answers read at (nearly) the
same time, per replica and per field of its `load` (`prefill_tokens_queued`, `decode_blocks`,
`requests_in_flight`), `|a - b|`. Peer sync sends deltas every 20 ms, so two live coordinators
disagree by what changed within that window; the tolerance says how much that is allowed to be:

    within(a, b) = |a - b| <= max(FLOOR[field], TOLERANCE_REL * max(a, b))

with `TOLERANCE_REL` = 0.1 and `FLOOR` = 2 requests, 16 decode blocks (one request's blocks of
prompt + 128 tokens), 256 prefill tokens (about one prompt). A sample is within tolerance when
every replica's every field is. `convergence`: from a time on (the restart's ready), the first
sample within tolerance (`converged_after_s`), the share of samples within tolerance after it,
and the largest difference seen per field; the same share before the kill is the steady-state
reference. Once the load stops and every request returned, both must read exactly 0 everywhere
(`runner.load_is_zero` on each).

Killed coordinator's requests by phase (`by_phase`), against the kill time and the restarted
process's ready time: `in_flight_at_kill` (started before the kill, failed: lost to their
client, which is what a load balancer in front retries), `while_down` (started between the kill
and the ready: refused), `after_ready` (started after the ready: must all succeed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.chaos.scenarios import classify
from benchmarks.live.client import RequestResult

TOLERANCE_REL = 0.1
FLOOR: dict[str, int] = {
    "prefill_tokens_queued": 256,
    "decode_blocks": 16,
    "requests_in_flight": 2,
}

# (seconds since the load started, per replica id its `load` dict as coordinator A sees it,
#  the same as coordinator B sees it)
LoadSample = tuple[float, dict[str, dict[str, int]], dict[str, dict[str, int]]]


def load_difference(
    a: dict[str, dict[str, int]], b: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """Per replica (in either view) and field, `|a - b|` (a field one side lacks counts as 0)."""
    diff: dict[str, dict[str, int]] = {}
    for replica in sorted(set(a) | set(b)):
        la, lb = a.get(replica, {}), b.get(replica, {})
        diff[replica] = {f: abs(la.get(f, 0) - lb.get(f, 0)) for f in sorted(set(la) | set(lb))}
    return diff


def within_tolerance(a: dict[str, dict[str, int]], b: dict[str, dict[str, int]]) -> bool:
    """Every replica's every field within `max(FLOOR, TOLERANCE_REL * larger)` (docstring)."""
    for replica in set(a) | set(b):
        la, lb = a.get(replica, {}), b.get(replica, {})
        for f in set(la) | set(lb):
            x, y = la.get(f, 0), lb.get(f, 0)
            if abs(x - y) > max(FLOOR.get(f, 0), TOLERANCE_REL * max(x, y)):
                return False
    return True


def convergence(samples: Sequence[LoadSample], start: float, end: float) -> dict[str, Any]:
    """Samples in [start, end): first within tolerance (seconds after `start`), the share of
    samples within tolerance from that one on, and the largest difference per field."""
    window = [s for s in samples if start <= s[0] < end]
    first: float | None = None
    within_after = 0
    after = 0
    largest: dict[str, int] = {}
    for t, a, b in window:
        ok = within_tolerance(a, b)
        if first is None and ok:
            first = t - start
        if first is not None:
            after += 1
            within_after += ok
        for fields in load_difference(a, b).values():
            for f, d in fields.items():
                largest[f] = max(largest.get(f, 0), d)
    return {
        "samples": len(window),
        "converged_after_s": None if first is None else round(first, 3),
        "within_tolerance_share": round(within_after / after, 3) if after else None,
        "largest_difference": largest,
    }


def by_phase(
    results: Sequence[RequestResult], killed_at: float, ready_at: float | None
) -> dict[str, dict[str, int]]:
    """The killed coordinator's requests by when they started (see the module docstring);
    `in_flight_at_kill` counts only those that had not ended before the kill."""
    ready = float("inf") if ready_at is None else ready_at
    phases: dict[str, list[RequestResult]] = {"in_flight_at_kill": [], "while_down": []}
    phases["after_ready"] = []
    for r in results:
        if r.start_s < killed_at:
            if r.end_s >= killed_at:
                phases["in_flight_at_kill"].append(r)
        elif r.start_s < ready:
            phases["while_down"].append(r)
        else:
            phases["after_ready"].append(r)
    return {name: classify(rs) for name, rs in phases.items()}


# (seconds since the load started, per replica the survivor's `indexed_blocks`, the restarted
#  coordinator's)
IndexSample = tuple[float, dict[str, int], dict[str, int]]
REBUILT_SHARE = 0.95


def index_rebuilt_after(samples: Sequence[IndexSample], start: float) -> float | None:
    """Seconds from `start` to the first sample where the restarted coordinator's index holds
    at least `REBUILT_SHARE` (0.95) of the survivor's blocks on every replica (the survivor has
    followed the engines all along; under load both trail the engines by the events in flight,
    so the survivor, read in the same poll, is the fair reference). None: never."""
    for t, survivor, restarted in samples:
        if t < start or not survivor:
            continue
        if all(restarted.get(r, 0) >= REBUILT_SHARE * n for r, n in survivor.items()):
            return round(t - start, 3)
    return None


def first_success_after(results: Sequence[RequestResult], t: float) -> float | None:
    """Seconds from `t` to the first byte of the first request started at or after `t` that
    succeeded (None: none did)."""
    firsts = [
        r.start_s + r.ttft_s - t
        for r in results
        if r.ok and r.start_s >= t and r.ttft_s is not None
    ]
    return round(min(firsts), 3) if firsts else None
