"""The chaos scenarios and how their figures are computed (pure: no I/O, no clock).

Scenarios (each on a fresh 2P+2D fleet, under the same steady load; `fault` at `warmup_s`):

| name | fault | recovery |
|---|---|---|
| `baseline` | none (what the load alone costs on this machine) | `down_s` later |
| `kill-decode` | `kill -9` decode-0 | restart it on the same ports after `down_s` |
| `kill-prefill` | `kill -9` prefill-0 | restart after `down_s` |
| `kill-both-prefill` | `kill -9` prefill-0 and prefill-1 | restart both after `down_s` |
| `stop-decode` | SIGSTOP decode-0 (hung: no reset, no FIN) | SIGCONT after `stop_s` (10 s) |
| `restart-decode` | SIGTERM decode-0, start it again on the same ports at once | (the start) |
| `slow-decode` | decode-0's HTTP slowed by `SLOW_DELAY_S` each way | delay off after `stop_s` |
| `kv-events-lost` | decode-0's KV events dropped (a ZMQ relay) | through after `stop_s` |

(`relays.py`: the local TCP proxy and ZMQ relay; after `kv-events-lost` the coordinator sees
the sequence gap at the first message and replays the lost ones from the engine.) Every
scenario also compares the coordinator's KV index with the engines' prefix caches at the end
(`runner.kv_index_vs_engines`).

Per request (`classify`): `succeeded`; `failed_before_first_byte` (an error and no token
reached the client: a non-200, or a stream that failed before its first text chunk);
`broken_mid_stream` (an error after the first token: the stream ended with an error event or
was cut); `hung` (independent of the others): a gap of more than `HUNG_S` = 5 s with no byte,
i.e. the largest of TTFT, each inter-chunk gap and the gap from the last chunk to the end. A
non-streamed answer's first byte is its last, so it is hung when it took more than 5 s.
`largest_gap_s` per kind (`gap_quantiles`): that largest gap's p50 / p99 / max, the margin
below `HUNG_S`.

Routing (`routing_times`, from `/admin/pools` polled every `poll_s`): `out_s` = first poll
after the fault where the faulted replica is not `healthy`, minus the fault time; `back_s` =
first poll after the recovery where it is `healthy` again, minus the recovery time (for a kill:
the restarted engine's ready line; for SIGSTOP: the SIGCONT). None: never seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from benchmarks.live.client import RequestResult

HUNG_S = 5.0

Fault = Literal["none", "kill", "stop", "restart", "slow", "events-lost"]
# one-way latency `slow-decode` adds (each way: 0.3 s more per round trip, under the 0.5 s
# probe timeout, so the replica is slow, not dead)
SLOW_DELAY_S = 0.15


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    fault: Fault
    replicas: tuple[str, ...]
    description: str


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("baseline", "none", (), "no fault: the same load and timeline"),
        Scenario("kill-decode", "kill", ("decode-0",), "kill -9 a decode engine"),
        Scenario("kill-prefill", "kill", ("prefill-0",), "kill -9 a prefill engine"),
        Scenario(
            "kill-both-prefill", "kill", ("prefill-0", "prefill-1"), "kill -9 both prefill engines"
        ),
        Scenario("stop-decode", "stop", ("decode-0",), "SIGSTOP a decode engine, then SIGCONT"),
        Scenario(
            "restart-decode", "restart", ("decode-0",), "restart a decode engine on the same port"
        ),
        Scenario(
            "slow-decode",
            "slow",
            ("decode-0",),
            f"network to a decode engine slowed by {SLOW_DELAY_S:g} s each way",
        ),
        Scenario(
            "kv-events-lost",
            "events-lost",
            ("decode-0",),
            "a decode engine's KV events lost, then through again (gap, replay)",
        ),
    )
}


def largest_gap_s(r: RequestResult) -> float:
    """The longest time the client waited for a byte (see the module docstring)."""
    total = r.end_s - r.start_s
    if r.ttft_s is None:
        return total
    gaps = [r.ttft_s, *r.itl_s]
    last_byte = r.ttft_s + sum(r.itl_s)
    gaps.append(max(0.0, total - last_byte))
    return max(gaps)


def classify(results: Sequence[RequestResult]) -> dict[str, int]:
    """Counts per outcome (see the module docstring)."""
    counts = {
        "sent": len(results),
        "succeeded": 0,
        "failed_before_first_byte": 0,
        "broken_mid_stream": 0,
        "hung": 0,
    }
    for r in results:
        if r.ok:
            counts["succeeded"] += 1
        elif r.ttft_s is None:
            counts["failed_before_first_byte"] += 1
        else:
            counts["broken_mid_stream"] += 1
        if largest_gap_s(r) > HUNG_S:
            counts["hung"] += 1
    return counts


def gap_quantiles(results: Sequence[RequestResult]) -> dict[str, float | None]:
    """p50 / p99 / max of `largest_gap_s` over `results` (nearest rank; None when empty): how
    close a load came to `HUNG_S`, so a run can show its margin, not only its hung count."""
    gaps = sorted(largest_gap_s(r) for r in results)
    if not gaps:
        return {"p50": None, "p99": None, "max": None}
    at = {q: gaps[min(len(gaps) - 1, int(q * len(gaps)))] for q in (0.5, 0.99)}
    return {"p50": round(at[0.5], 3), "p99": round(at[0.99], 3), "max": round(gaps[-1], 3)}


def first_errors(results: Sequence[RequestResult], limit: int = 3) -> list[str]:
    """Up to `limit` distinct error messages (their first 160 characters), in order seen."""
    seen: list[str] = []
    for r in sorted(results, key=lambda r: r.end_s):
        if r.error is not None and r.error[:160] not in seen:
            seen.append(r.error[:160])
            if len(seen) == limit:
                break
    return seen


def hung_requests(results: Sequence[RequestResult], limit: int = 40) -> list[dict[str, Any]]:
    """The hung requests (first `limit` by start): kind, start/end and TTFT (seconds from the
    load's start), their largest gap, and the error if any: where in the timeline they hung."""
    hung = sorted((r for r in results if largest_gap_s(r) > HUNG_S), key=lambda r: r.start_s)
    return [
        {
            "kind": r.group,
            "start_s": round(r.start_s, 3),
            "end_s": round(r.end_s, 3),
            "ttft_s": None if r.ttft_s is None else round(r.ttft_s, 3),
            "largest_gap_s": round(largest_gap_s(r), 3),
            "error": r.error,
        }
        for r in hung[:limit]
    ]


Poll = tuple[float, dict[str, str]]  # (seconds since the run started, replica id → state)


def routing_times(
    polls: Sequence[Poll], replica: str, fault_at: float, recovered_at: float | None
) -> tuple[float | None, float | None]:
    """(out_s, back_s) for `replica` (see the module docstring)."""
    out_s: float | None = None
    for t, states in polls:
        if t >= fault_at and states.get(replica, "healthy") != "healthy":
            out_s = t - fault_at
            break
    back_s: float | None = None
    if recovered_at is not None:
        for t, states in polls:
            if t >= recovered_at and states.get(replica) == "healthy":
                back_s = t - recovered_at
                break
    return out_s, back_s


def token_load_left(view: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Every replica's token load from a `/admin/pools` answer."""
    left: dict[str, dict[str, int]] = {}
    for pool in view["pools"].values():
        for replica in pool["replicas"]:
            left[replica["id"]] = dict(replica["load"])
    return left


def load_is_zero(view: dict[str, Any]) -> bool:
    loads = token_load_left(view)
    return view.get("tracked_requests") == 0 and all(
        v == 0 for load in loads.values() for v in load.values()
    )
