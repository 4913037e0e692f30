"""Accounting of one planner run: what `results.json` holds per planner.

- **attainment** (`{"both", "ttft", "itl"}`): the share of all arrived requests whose TTFT
  (`ttft`), per-request mean ITL (`itl`), or both (`both`) are within the policy's targets
  (a request never served, or lost, is within neither). Three target pairs:
  `attainment` at the policy's pair, `attainment_p90` the same targets held at p90 (the
  fractions are the same; its `met` asks only ≥ 90 %), `attainment_loose` at 2x both targets
  held at the policy's percentile. Each carries `required` (percentile / 100), `met`
  (`both ≥ required`), the targets, and the observed TTFT/ITL at that percentile.
- **per_minute**: per minute of arrival, requests and the three attainments at the policy
  pair.
- **gpu_hours**: Σ over replicas of (time from being asked for to leaving) x GPUs per
  replica, i.e. the integral of (ready + pending + draining)·gpus_per_replica; pending
  replicas are paid for. Per pool in `gpu_hours_by_pool` (a moved replica counts in the pool
  it ended in).
- **timeline**: every `record_s` (10 s): arrival rps, observed p90 TTFT and ITL over those
  10 s, and per pool ready / pending / draining.
- **events**: every change of a pool's provisioned count (`kind` `scale`, with the planner's
  reason) and every role move (`kind` `move`: two events, the taker's up and the giver's
  down; runs before Round 11 logged only the taker's).
- **direction_changes** per pool: sign changes between consecutive non-zero changes of the
  planner's desired count (one per tick).
- **direction_changes_worst_10min** per pool: the issue's flap measure, the most direction
  changes of the pool's provisioned count (its `events`, scale and move alike: a change of
  opposite sign to the change before it) inside any 600 s window, sliding
  (`benchmarks/autoscale_sim/flaps.py`, from `events`: merged folders of older runs get it
  in their report and `--json` summary too).
- **lifecycle_s**: per pool, `ready` = each cold start's time from being asked for to ready,
  `drained` = each scale-down's time from its drain starting to the replica leaving.
- **lost**: requests aborted at a drain timeout (arrived - completed; 0 expected).
- **time_to_capacity_s** (all pools) and **time_to_capacity_by_pool_s**: per pool, from a
  breach to the next replica joining that pool. A *breach* is the first planner tick (every
  `interval_s`, 5 s) at which the observed p90 TTFT (prefill) / p90 ITL (decode) over the
  planner's window exceeds the target, or at which the planner's reactive term binds (its
  `details[pool]` shows `reactive` above both `floor` and the ready count: the observed
  window asks for capacity now; pdorch's planner reports these, other planners only the
  first criterion). *Added capacity* is a replica joining the pool: a cold start becoming
  ready (`ready`), a role move landing (`moved`, a ready or a draining replica of the other
  pool) or a draining replica recalled (`recall`: it serves at once), at that tick or later.
  The next breach is looked for after the join. `capacity_episodes` lists each as `{pool,
  breach_s, capacity_s, seconds, kind, by, ordered_s}` (`by`: `p90` or `reactive`;
  `ordered_s`: the first scale-up or move into the pool at or after the breach and not after
  the join, None when the capacity was ordered before the breach); `breaches_unresolved`
  counts breaches no capacity followed.
- **capacity_distribution**: per pool, over every episode (not only the first): `all` and
  `by_kind` (`cold_start`, `move`, `recall`), each `{count, median_s, p90_s, max_s,
  share_within_goal}` (the share of episodes with capacity within `CAPACITY_GOAL_S`, 10 s:
  issue 11's goal), plus `breach_to_order` (the same over `ordered_s - breach_s`: how long the
  planner took to ask; the rest is the actuator's delivery).
- **recalls** / **drain_moves**: per pool, the draining replicas a scale-up recalled / moved
  in from the other pool (`benchmarks/autoscale_sim/actuator.py`).
- **role_moves**: each moved replica as `{replica, from, to, asked_s, ready_s, seconds}`:
  from the move being asked for to the replica serving its new pool (its drain of the old
  role's in-flight work + `switch_s`; `ready_s` None if it had not landed by the end).
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

from autoscale.decision import ScaleDecision
from autoscale.policy import SloPolicy
from autoscale.signals import Observation, Pool
from autoscale.sizing import itl_target_s, ttft_target_s
from benchmarks.autoscale_sim.capacity import KIND_NAMES, capacity_distribution
from benchmarks.autoscale_sim.flaps import worst_window_direction_changes
from benchmarks.autoscale_sim.observe import mean_itl_s, percentile, ttft_s
from benchmarks.fleet_sim.membership import (
    POOLS,
    DynamicFleetSimulator,
    DynamicResult,
    MembershipEvent,
)

if TYPE_CHECKING:
    from benchmarks.autoscale_sim.actuator import SimActuator
    from benchmarks.fleet_sim.simulator import RequestRecord

LOOSE_FACTOR = 2.0


class Recorder:
    """Timeline samples (module docstring)."""

    def __init__(self, policy: SloPolicy) -> None:
        self.policy = policy
        self.timeline: list[dict[str, Any]] = []

    def sample(self, obs: Observation, sim: DynamicFleetSimulator) -> None:
        row: dict[str, Any] = {
            "t_s": obs.now,
            "arrival_rps": obs.arrival_rps,
            "ttft_p90_s": obs.ttft.p90_s,
            "itl_p90_s": obs.itl.p90_s,
        }
        for pool in POOLS:
            ready, pending, draining = sim.status(pool)
            row[pool] = {"ready": ready, "pending": pending, "draining": draining}
        self.timeline.append(row)


class BreachTracker:
    """Planner ticks at which a pool was in breach (module docstring, `time_to_capacity_s`)."""

    def __init__(self, policy: SloPolicy) -> None:
        self.ttft_s = ttft_target_s(policy)
        self.itl_s = itl_target_s(policy)
        self.breach: dict[str, list[tuple[float, str]]] = {p: [] for p in POOLS}

    def see(self, obs: Observation, decision: ScaleDecision) -> None:
        observed = {"prefill": (obs.ttft.p90_s, self.ttft_s), "decode": (obs.itl.p90_s, self.itl_s)}
        for pool in POOLS:
            p90, target = observed[pool]
            if p90 is not None and p90 > target:
                self.breach[pool].append((obs.now, "p90"))
                continue
            d = decision.details.get(pool)
            if not isinstance(d, dict):
                continue
            react, floor = d.get("reactive"), d.get("floor")
            ready = obs.pool(Pool(pool)).ready
            if isinstance(react, int) and isinstance(floor, int) and react > max(floor, ready):
                self.breach[pool].append((obs.now, "reactive"))


def direction_changes(desired: list[int]) -> int:
    """Sign changes between consecutive non-zero changes of `desired`."""
    changes = 0
    last = 0
    for a, b in itertools.pairwise(desired):
        d = b - a
        if d == 0:
            continue
        sign = 1 if d > 0 else -1
        if last and sign != last:
            changes += 1
        last = sign
    return changes


def _attainment(
    records: list[RequestRecord], ttft_t: float, itl_t: float, required: float
) -> dict[str, Any]:
    return attainment_of(
        [
            (ttft_s(r), mean_itl_s(r), True) if r.finish is not None else (None, None, False)
            for r in records
        ],
        ttft_t,
        itl_t,
        required,
    )


def attainment_of(
    samples: list[tuple[float | None, float | None, bool]],
    ttft_t: float,
    itl_t: float,
    required: float,
) -> dict[str, Any]:
    """SLO attainment over `(ttft_s, mean_itl_s, finished)` per request: within TTFT when it
    has a first token within `ttft_t`; within ITL when it finished and its mean ITL (if any:
    one-token outputs have none) is within `itl_t`; both when both. Shared by the what-if and
    the live run (`benchmarks/autoscale_live/accounting.py`)."""
    n = len(samples)
    ok_t = ok_i = ok_b = 0
    ttfts: list[float] = []
    itls: list[float] = []
    for t, i, done in samples:
        a = t is not None and t <= ttft_t
        b = done and (i is None or i <= itl_t)
        ok_t += a
        ok_i += b
        ok_b += a and b
        ttfts.append(t if t is not None else math.inf)
        if i is not None:
            itls.append(i)
    ttfts.sort()
    itls.sort()
    q = required * 100
    both = ok_b / n if n else 1.0
    return {
        "both": both,
        "ttft": ok_t / n if n else 1.0,
        "itl": ok_i / n if n else 1.0,
        "required": required,
        "met": both >= required,
        "ttft_target_ms": ttft_t * 1000,
        "itl_target_ms": itl_t * 1000,
        "ttft_at_percentile_s": percentile(ttfts, q) if ttfts else None,
        "itl_at_percentile_s": percentile(itls, q) if itls else None,
    }


def _per_minute(records: list[RequestRecord], ttft_t: float, itl_t: float) -> list[dict[str, Any]]:
    buckets: dict[int, list[RequestRecord]] = {}
    for r in records:
        buckets.setdefault(int(r.arrival // 60), []).append(r)
    out = []
    for minute in sorted(buckets):
        a = _attainment(buckets[minute], ttft_t, itl_t, 0.0)
        out.append(
            {
                "t_s": minute * 60.0,
                "requests": len(buckets[minute]),
                "attainment_both": a["both"],
                "attainment_ttft": a["ttft"],
                "attainment_itl": a["itl"],
            }
        )
    return out


def time_to_capacity(
    tracker: BreachTracker,
    events: list[MembershipEvent],
    orders: list[dict[str, Any]] | None = None,
) -> tuple[dict[str, list[float]], list[dict[str, Any]], int]:
    """Per pool breach -> added capacity seconds, the episodes, and the unresolved count.
    `orders`: the actuator's events (`ScaleEvent.as_dict`), for each episode's `ordered_s`."""
    joins: dict[str, list[tuple[float, str]]] = {p: [] for p in POOLS}
    for e in events:
        if e.kind in KIND_NAMES and e.t_s > 0:
            joins[e.pool].append((e.t_s, e.kind))
    ups: dict[str, list[float]] = {p: [] for p in POOLS}
    for o in orders or []:
        if o["to"] > o["from"] and o["pool"] in ups:
            ups[o["pool"]].append(float(o["t_s"]))
    out: dict[str, list[float]] = {p: [] for p in POOLS}
    episodes: list[dict[str, Any]] = []
    unresolved = 0
    for pool in POOLS:
        times = sorted(joins[pool])
        resolved_until = -math.inf
        for t, by in tracker.breach[pool]:
            if t <= resolved_until:
                continue
            later = [j for j in times if j[0] >= t - 1e-9]
            if not later:
                unresolved += 1
                resolved_until = math.inf
                continue
            at, kind = later[0]
            out[pool].append(at - t)
            asked = [u for u in ups[pool] if t - 1e-9 <= u <= at + 1e-9]
            episodes.append(
                {
                    "pool": pool,
                    "breach_s": t,
                    "capacity_s": at,
                    "seconds": at - t,
                    "kind": kind,
                    "by": by,
                    "ordered_s": min(asked) if asked else None,
                }
            )
            resolved_until = at
    return out, episodes, unresolved


def role_move_landings(events: list[MembershipEvent]) -> list[dict[str, Any]]:
    """Each role move, from asked (`move`) to serving the new pool (`moved`)."""
    out: list[dict[str, Any]] = []
    open_moves: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.kind == "move":
            src = "decode" if e.pool == "prefill" else "prefill"
            row: dict[str, Any] = {"replica": e.replica_id, "from": src, "to": e.pool}
            row.update({"asked_s": e.t_s, "ready_s": None, "seconds": None})
            open_moves[e.replica_id] = row
            out.append(row)
        elif e.kind == "moved" and e.replica_id in open_moves:
            row = open_moves.pop(e.replica_id)
            row["ready_s"] = e.t_s
            row["seconds"] = e.t_s - float(row["asked_s"])
    return out


def lifecycle_s(dyn: DynamicResult) -> dict[str, dict[str, list[float]]]:
    """Per pool: asked-for → ready and drain → removed times of each replica (docstring)."""
    out: dict[str, dict[str, list[float]]] = {p: {"ready": [], "drained": []} for p in POOLS}
    added: dict[str, float] = {}
    drained: dict[str, float] = {}
    for e in dyn.events:
        if e.kind == "add" and e.t_s > 0:  # the fleet at t = 0 was not asked for
            added[e.replica_id] = e.t_s
        elif e.kind == "ready" and e.replica_id in added:
            out[e.pool]["ready"].append(e.t_s - added.pop(e.replica_id))
        elif e.kind == "drain":
            drained[e.replica_id] = e.t_s
        elif e.kind == "removed" and e.replica_id in drained:
            out[e.pool]["drained"].append(e.t_s - drained.pop(e.replica_id))
    return out


def planner_result(
    name: str,
    policy: SloPolicy,
    dyn: DynamicResult,
    sim: DynamicFleetSimulator,
    actuator: SimActuator,
    recorder: Recorder,
    tracker: BreachTracker,
    *,
    initial: dict[Pool, int],
    role_switching: bool,
    plan_cpu_s: float,
) -> dict[str, Any]:
    """The per-planner dict of `results.json` (module docstring)."""
    records = dyn.sim.requests
    tt, it = ttft_target_s(policy), itl_target_s(policy)
    q_ttft = policy.slo.ttft_ms.percentile / 100
    gpus = {p.value: policy.pools[p].gpus_per_replica for p in Pool}
    gpu_s = sim.gpu_seconds(dyn.end_s, gpus)
    events = [e.as_dict() for e in actuator.events]
    ttc, episodes, unresolved = time_to_capacity(tracker, dyn.events, events)
    return {
        "planner": name,
        "attainment": _attainment(records, tt, it, q_ttft),
        "attainment_p90": _attainment(records, tt, it, 0.90),
        "attainment_loose": _attainment(records, LOOSE_FACTOR * tt, LOOSE_FACTOR * it, q_ttft),
        "per_minute": _per_minute(records, tt, it),
        "gpu_hours": sum(gpu_s.values()) / 3600.0,
        "gpu_hours_by_pool": {p: v / 3600.0 for p, v in gpu_s.items()},
        "lost": dyn.lost,
        "requests": dyn.arrived,
        "completed": dyn.completed,
        "direction_changes": {p.value: direction_changes(actuator.desired[p]) for p in Pool},
        "events": events,
        "direction_changes_worst_10min": {
            p.value: worst_window_direction_changes(events, p.value) for p in Pool
        },
        "membership_events": len(dyn.events),
        "timeline": recorder.timeline,
        "time_to_capacity_s": ttc["prefill"] + ttc["decode"],
        "time_to_capacity_by_pool_s": ttc,
        "capacity_episodes": episodes,
        "capacity_distribution": capacity_distribution(episodes),
        "recalls": {p.value: n for p, n in actuator.recalls.items()},
        "drain_moves": {p.value: n for p, n in actuator.drain_move_count.items()},
        "role_moves": role_move_landings(dyn.events),
        "breaches_unresolved": unresolved,
        "lifecycle_s": lifecycle_s(dyn),
        "initial": {p.value: n for p, n in initial.items()},
        "role_switching": role_switching,
        "interval_s": None,
        "end_s": dyn.end_s,
        "sim_cpu_s": dyn.sim.cpu_s,
        "sim_wall_s": dyn.sim.wall_s,
        "plan_cpu_s": plan_cpu_s,
    }
