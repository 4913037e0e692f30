"""`SimActuator`: the `Actuator` interface over the dynamic fleet simulator, in virtual time.

- `scale(pool, n, now)` up: `k = n - provisioned` replicas, taken in this order (the rule
  every actuator follows, `autoscale.actuators.recall.plan_scale_up`, `autoscale/README.md`
  "Recall"):
  1. **recall** the pool's own draining replicas (`recall=True`, the default): back in routing
     at once, their in-flight work continues. Most in-flight work first (ties: the latest to
     start draining): the others leave soonest, so the least drain time stays paid for, and
     its prefix cache is the warmest;
  2. with role switching on and `drain_moves=True` (the default), **move** the other pool's
     draining replicas that would land before a cold start (estimated remaining drain, the
     longest running output x the ITL target, + `switch_s` < `startup_s`), soonest first;
  3. **cold start** the rest, pending for the pool's `startup_s` (0 with `instant=True`: the
     oracle's replicas start instantly, its definition).
- `scale(pool, n, now)` down: cancel pending cold starts first (the latest to be ready
  first: nothing routed to them yet), then drain ready replicas, least loaded first (fewest
  running + waiting sequences; ties: the newest), each out of routing at once and gone when
  its in-flight work is done (bounded by the pool's `drain_timeout_s`). A pool is never left
  without a ready replica by a drain or a move (routing would have nowhere to send a
  request); a planner asking for 0 gets 1 until the policy's `min` allows 0 *and* nothing
  arrives, which the simulator does not model.
- `switch_role(replica, to_pool, now)`: the replica drains its current-role work, then
  `switch_s` later serves the other pool; pending in the new pool meanwhile.
- `switchable(pool)`: with role switching on, the pool's ready replicas, least loaded first,
  all but one.

Every `apply` is logged: one `ScaleEvent` per pool whose desired count changed (`kind`
`scale`, with the planner's reason) and two per role move (`kind` `move`): the taker's up
(reason `role-move from POOL`, or `role-return from POOL` for a loan given back) and the
giver's down (`role-move to POOL` / `role-return to POOL`; before Round 11 only the taker's
was logged, so the flap measure missed the giver's side of every move). `recalls` and
`drain_moves` count what step 1 and 2 of a scale-up did.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoscale.actuators.base import Actuator, ActuatorError, PoolKey
from autoscale.actuators.recall import DrainingReplica, plan_scale_up
from autoscale.decision import ScaleDecision
from autoscale.policy import SloPolicy
from autoscale.signals import Pool, PoolStatus
from autoscale.sizing import itl_target_s
from benchmarks.fleet_sim.membership import (
    DRAINING,
    PENDING,
    READY,
    DynamicFleetSimulator,
)


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    t_s: float
    pool: str
    from_n: int
    to_n: int
    reason: str
    kind: str  # "scale" | "move"

    def as_dict(self) -> dict[str, object]:
        return {
            "t_s": self.t_s,
            "pool": self.pool,
            "from": self.from_n,
            "to": self.to_n,
            "reason": self.reason,
            "kind": self.kind,
        }


class SimActuator(Actuator):
    """See the module docstring."""

    def __init__(
        self,
        sim: DynamicFleetSimulator,
        policy: SloPolicy,
        *,
        instant: bool = False,
        role_switching: bool | None = None,
        recall: bool = True,
        drain_moves: bool = True,
    ) -> None:
        self.sim = sim
        self.policy = policy
        self.instant = instant
        self.role_switching = policy.role_switching if role_switching is None else role_switching
        self.recall = recall
        self.drain_moves = drain_moves
        self.events: list[ScaleEvent] = []
        self.desired: dict[Pool, list[int]] = {p: [] for p in Pool}
        self.recalls = {p: 0 for p in Pool}
        self.drain_move_count = {p: 0 for p in Pool}  # per receiving pool

    def current(self) -> dict[PoolKey, PoolStatus]:
        return {p: PoolStatus(*self.sim.status(p.value)) for p in Pool}

    def _load(self, rid: str) -> tuple[int, int]:
        st = self.sim.by_id[rid].core.stats()
        return (st.num_running + st.num_waiting, -self.sim.by_id[rid].index)

    def scale(self, pool: Pool, replicas: int, now: float) -> None:
        sim = self.sim
        limits = self.policy.pools[pool]
        ready, pending, _ = sim.status(pool.value)
        provisioned = ready + pending
        if replicas > provisioned:
            startup = 0.0 if self.instant else limits.startup_s
            plan = plan_scale_up(
                pool.value,
                replicas - provisioned,
                [] if self.instant else self._draining_replicas(),
                recall=self.recall,
                drain_moves=self.role_switching and self.drain_moves,
                startup_s=startup,
                switch_s=self.policy.switch_s,
            )
            for rid in plan.recall:
                sim.recall_replica(rid, now)
                self.recalls[pool] += 1
            for rid in plan.move:
                sim.move_draining(rid, now, self.policy.switch_s)
                self.drain_move_count[pool] += 1
            for _ in range(plan.cold_starts):
                sim.add_replica(pool.value, now, startup)
            return
        excess = provisioned - replicas
        cold = [m for m in sim.members.values() if m.pool == pool.value and m.state == PENDING]
        cold.sort(key=lambda m: (m.ready_at or 0.0, m.asked_at), reverse=True)
        for m in cold[:excess]:
            sim.cancel_pending(m.replica_id, now)
            excess -= 1
        ready_ids = sorted(sim.pool_members(pool.value, READY), key=self._load)
        while excess > 0 and len(ready_ids) > 1:
            sim.drain_replica(ready_ids.pop(0), now, limits.drain_timeout_s)
            excess -= 1

    def _draining_replicas(self) -> list[DrainingReplica]:
        """Every draining replica as the scale-up order reads it (`autoscale.actuators.recall`):
        its work and remaining drain are the longest running output at the ITL target (an
        upper bound while the SLO holds)."""
        itl = itl_target_s(self.policy)
        out = []
        for pool in Pool:
            timeout = self.policy.pools[pool].drain_timeout_s
            for rid in self.sim.pool_members(pool.value, DRAINING):
                reqs = self.sim.by_id[rid].core.requests.values()
                left = max(0, max((r.max_tokens - r.num_output_tokens for r in reqs), default=0))
                # one pool's drains share a timeout: the deadline orders them as their starts
                since = (self.sim.members[rid].drain_deadline or timeout) - timeout
                out.append(DrainingReplica(rid, pool.value, left * itl, since, left * itl))
        return out

    def switchable(self, pool: Pool) -> list[str]:
        if not self.role_switching:
            return []
        ready_ids = sorted(self.sim.pool_members(pool.value, READY), key=self._load)
        return ready_ids[:-1]

    def switch_role(self, replica_id: str, to_pool: Pool, now: float) -> None:
        m = self.sim.members.get(replica_id)
        if m is None or m.state != READY or m.pool == to_pool.value:
            raise ActuatorError(f"{replica_id} cannot move to {to_pool}")
        timeout = self.policy.pools[Pool(m.pool)].drain_timeout_s
        self.sim.switch_role(replica_id, now, self.policy.switch_s, timeout)

    @staticmethod
    def _move_reason(decision: ScaleDecision, to_pool: Pool) -> str:
        reason = decision.reasons.get(to_pool, "")
        return reason if reason.startswith("role-") else "role-move"

    def apply(self, decision: ScaleDecision, now: float) -> None:
        before = {p: s.provisioned for p, s in self.current().items()}
        moved = {p: 0 for p in Pool}
        for move in decision.moves:
            ids = self.switchable(move.from_pool)[: move.count]
            for rid in ids:
                self.switch_role(rid, move.to_pool, now)
            if ids:
                moved[move.from_pool] -= len(ids)
                moved[move.to_pool] += len(ids)
                self.events.append(
                    ScaleEvent(
                        now,
                        move.to_pool.value,
                        before[move.to_pool],
                        before[move.to_pool] + len(ids),
                        # "role-move" (a borrow) or "role-return" (a loan given back)
                        f"{self._move_reason(decision, move.to_pool)} from {move.from_pool.value}",
                        "move",
                    )
                )
                # the giver's count goes down as the taker's goes up: a move is a direction
                # change of both pools (the flap measure reads both events)
                self.events.append(
                    ScaleEvent(
                        now,
                        move.from_pool.value,
                        before[move.from_pool],
                        before[move.from_pool] - len(ids),
                        f"{self._move_reason(decision, move.to_pool)} to {move.to_pool.value}",
                        "move",
                    )
                )
        for pool, n in decision.desired.items():
            self.desired[pool].append(n)
            have = self.current()[pool].provisioned
            if have != n:
                self.scale(pool, n, now)
            after = self.current()[pool].provisioned
            if after != before[pool] + moved[pool]:
                self.events.append(
                    ScaleEvent(
                        now,
                        pool.value,
                        before[pool] + moved[pool],
                        after,
                        decision.reasons.get(pool, ""),
                        "scale",
                    )
                )
