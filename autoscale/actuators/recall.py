"""The scale-up order every actuator follows: recall, move a draining replica, cold start.

One decision model for the fleet simulator's actuator (`benchmarks/autoscale_sim/actuator.py`,
virtual time) and the local-process one (`autoscale/actuators/local.py`, real processes), so a
what-if run and a live fleet take back the same replicas for the same request
(`autoscale/README.md`, "Recall"). Pure: the actuator describes its draining replicas, this
module says which to take and how many cold starts remain.

For `want` replicas asked of pool `T` (`plan_scale_up`):

1. **recall** `T`'s own draining replicas (drained for a scale-down, not those leaving on a role
   move): back in routing at once, their in-flight work simply continues (it was never cut).
   Order: most in-flight work first (`work`), ties the latest to start draining (`since_s`):
   the others leave soonest, so the least drain time stays paid for, and the recalled one's
   prefix cache is the warmest. Off with `recall=False` (the actuator before Round 10);
2. with role switching on and `drain_moves=True`, **move** the other pool's role-agnostic
   draining replicas (scale-down drains) whose estimated landing, `remaining_s + switch_s`,
   is before a cold start's `startup_s`, soonest first: a replica draining to leave `G`
   serves `T` instead;
3. **cold start** the rest.

`remaining_s` is the actuator's estimate of the time left in a drain: the simulator reads the
longest running output x the ITL target (an upper bound while the SLO holds); the local
actuator does not see outputs and uses the time left before the drain's deadline (the drain
cannot last longer), so with `drain_timeout_s` > `startup_s` it moves a draining replica only
near its deadline.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DrainingReplica:
    """One replica draining for a scale-down, as the scale-up order reads it."""

    replica_id: str
    pool: str
    work: float  # in-flight work still on it (the recall order's key; any unit, larger first)
    since_s: float  # when its drain began (ties: the latest first)
    remaining_s: float  # estimated seconds until its drain ends
    movable: bool = True  # role-agnostic (sim role both, vLLM kv_both): step 2 may move it


@dataclass(frozen=True, slots=True)
class ScaleUpPlan:
    """What a scale-up of one pool does, in order (module docstring)."""

    recall: tuple[str, ...]  # the pool's own draining replicas back in routing
    move: tuple[str, ...]  # the other pool's draining replicas moved into it
    cold_starts: int  # new replicas to start


def plan_scale_up(
    pool: str,
    want: int,
    draining: list[DrainingReplica],
    *,
    recall: bool = True,
    drain_moves: bool = False,
    startup_s: float = 0.0,
    switch_s: float = 0.0,
) -> ScaleUpPlan:
    """The replicas a scale-up of `pool` by `want` takes, in the module docstring's order;
    `drain_moves` only with role switching on (the caller's check)."""
    left = max(0, want)
    recalled: list[str] = []
    if recall:
        own = sorted(
            (d for d in draining if d.pool == pool),
            key=lambda d: (d.work, d.since_s, d.replica_id),
            reverse=True,
        )
        recalled = [d.replica_id for d in own[:left]]
        left -= len(recalled)
    moved: list[str] = []
    if drain_moves and left > 0:
        others = sorted(
            (
                d
                for d in draining
                if d.pool != pool and d.movable and d.remaining_s + switch_s < startup_s
            ),
            key=lambda d: (d.remaining_s, d.replica_id),
        )
        moved = [d.replica_id for d in others[:left]]
        left -= len(moved)
    return ScaleUpPlan(tuple(recalled), tuple(moved), left)
