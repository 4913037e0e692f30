"""Dynamic fleet membership in virtual time: replicas start, drain, leave and switch role.

`DynamicFleetSimulator` is the fleet simulator (`simulator.py`, whose static path it leaves
untouched) with a membership state per replica and a `controller` called at metrics ticks:

    pending   asked for at `t0`; joins routing at `ready_at = t0 + startup_s` (exactly: due
              replicas join before any arrival is routed, and at every metrics tick)
    ready     in routing (`RequestLifecycle.add_replica`)
    draining  out of routing at once (`ReplicaStatic(healthy=False)`: no new requests), its
              in-flight work finishes; it leaves (`remove_replica`, index entries dropped) once
              it holds nothing: no request in its core, no step in flight, no held KV lease
              (a prefill replica stays until its decode replicas pulled the blocks), no leg
              headed to it, no transfer into it. Past `drain_deadline` what remains is aborted
              and counted in `lost` (never expected: the default timeout is 300 s)
    moving    a role switch: drains like `draining` (counted as *pending in the new pool*
              from the start, no longer in the old one), then `switch_s` later it is relabelled
              into the other pool (same engine core and prefix cache, same id) and is ready.
              A draining replica may also move (`move_draining`): it goes on draining under
              its deadline, then switches
    recalled  a draining replica taken back by its pool (`recall_replica`): ready again at
              once, back in routing; its in-flight work was never interrupted
    removed   gone (`left_at`); its step events are stale and skipped

Every replica is paid for from the moment it is asked for (`asked_at`) until it leaves
(`left_at`, or the end of the run): `gpu_seconds()`.

Decode fast-forward stays exact: membership changes and the controller run only at metrics
ticks or just before an arrival is routed, both of which already bound every replica's
horizon; a drain or a role change never touches an engine core between its events (it only
changes who routing sees). Control ticks must therefore be multiples of `tick_s` (checked).

Requests are never dropped by scaling: a request stays on the replica it was routed to until
it finishes; `arrived` / `completed` / `lost` count them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from benchmarks.fleet_sim.records import RequestRecord, SimConfig, SimResult
from benchmarks.fleet_sim.replica import SimReplica
from benchmarks.fleet_sim.simulator import FleetSimulator
from benchmarks.workloads.model import Workload
from pools.sim.engine_core import StepResult
from pools.sim.outputs import DecodeFastForward
from router.vocabulary import PoolName

PENDING, READY, DRAINING, MOVING, REMOVED = "pending", "ready", "draining", "moving", "removed"
POOLS = ("prefill", "decode")
_EPS = 1e-9

Controller = Callable[["DynamicFleetSimulator", float], None]


def other_pool(pool: str) -> str:
    return "decode" if pool == "prefill" else "prefill"


@dataclass(slots=True)
class Member:
    """One replica's membership (module docstring)."""

    replica_id: str
    pool: str  # the pool it serves, or will serve once pending/moving ends
    state: str
    asked_at: float
    ready_at: float | None = None  # pending/moving: when it joins routing
    drain_deadline: float | None = None
    drained_at: float | None = None  # moving: when its old-role work ended
    left_at: float | None = None
    from_pool: str | None = None  # moving: the pool it leaves
    switch_s: float = 0.0


@dataclass(slots=True)
class MembershipEvent:
    """One membership change, for the accounting (`kind`: add, ready, drain, removed, move,
    moved, cancel, abort, recall)."""

    t_s: float
    replica_id: str
    pool: str
    kind: str


@dataclass(slots=True)
class DynamicResult:
    """The simulation's `SimResult` plus what membership did."""

    sim: SimResult
    members: list[Member]
    events: list[MembershipEvent]
    arrived: int
    completed: int
    lost: int
    end_s: float
    gpu_seconds: dict[str, float] = field(default_factory=dict)


class DynamicFleetSimulator(FleetSimulator):
    """The fleet simulator with replicas that come and go (module docstring)."""

    def __init__(
        self,
        workload: Workload,
        config: SimConfig,
        *,
        controller: Controller | None = None,
        control_interval_s: float | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        if config.fleet.colocated:
            raise ValueError("dynamic membership sizes prefill and decode pools only")
        super().__init__(workload, config, progress)
        self.controller = controller
        self.control_interval_s = control_interval_s
        if control_interval_s is not None:
            ratio = control_interval_s / config.tick_s
            if control_interval_s <= 0 or abs(ratio - round(ratio)) > 1e-6:
                raise ValueError(
                    f"control interval {control_interval_s} s is not a multiple of the "
                    f"metrics tick {config.tick_s} s"
                )
        self.next_control = 0.0
        self.members: dict[str, Member] = {}
        self.mevents: list[MembershipEvent] = []
        self._due: list[str] = []  # pending / moving replicas (cheap to scan: few)
        self._leaving: list[str] = []  # draining / moving-while-draining
        self._counter = {"prefill": 0, "decode": 0}
        self.tps = 8192 / self.timing.prefill_time(8192)
        self.arrived = 0
        self.completed = 0
        self.lost = 0
        self.lost_ids: set[str] = set()
        self.finished_records: list[RequestRecord] = []  # in finish order
        self.first_token_records: list[RequestRecord] = []  # in first-token order
        self.prefill_leg_records: list[RequestRecord] = []  # in prefill-leg-end order
        self.now = 0.0
        # per replica: [Σ step seconds, steps] of the steps started so far (engine busy time)
        self.step_time: dict[str, list[float]] = {}
        self._counted: dict[str, StepResult] = {}
        for rep in self.replicas:
            self.members[rep.id] = Member(rep.id, rep.role, READY, 0.0, ready_at=0.0)
            self._counter[rep.role] += 1

    # ------------------------------------------------------------------ membership API
    def pool_members(self, pool: str, state: str) -> list[str]:
        return [m.replica_id for m in self.members.values() if m.pool == pool and m.state == state]

    def status(self, pool: str) -> tuple[int, int, int]:
        """(ready, pending, draining) of `pool`; a moving replica is pending in its new pool."""
        ready = pending = draining = 0
        for m in self.members.values():
            if m.pool != pool:
                continue
            if m.state == READY:
                ready += 1
            elif m.state in (PENDING, MOVING):
                pending += 1
            elif m.state == DRAINING:
                draining += 1
        return ready, pending, draining

    def add_replica(self, pool: str, now: float, startup_s: float) -> str:
        """Ask for a new replica of `pool`; it joins routing `startup_s` from `now`."""
        if pool not in POOLS:
            raise ValueError(f"unknown pool {pool!r}")
        tag = pool[0]
        rid = f"{tag}{self._counter[pool]}"
        while rid in self.members:
            self._counter[pool] += 1
            rid = f"{tag}{self._counter[pool]}"
        self._counter[pool] += 1
        rep = self._make_replica(rid, pool, len(self.replicas))
        self.replicas.append(rep)
        self.by_id[rid] = rep
        self.members[rid] = Member(rid, pool, PENDING, now, ready_at=now + startup_s)
        self.mevents.append(MembershipEvent(now, rid, pool, "add"))
        self._due.append(rid)
        self._activate_due(now)
        return rid

    def cancel_pending(self, rid: str, now: float) -> None:
        """A pending cold start is no longer wanted: it leaves at once (never routed)."""
        m = self.members[rid]
        if m.state != PENDING:
            raise ValueError(f"{rid} is {m.state}, not pending")
        m.state = REMOVED
        m.left_at = now
        self._due.remove(rid)
        self.by_id[rid].next_event = None
        self.mevents.append(MembershipEvent(now, rid, m.pool, "cancel"))

    def drain_replica(self, rid: str, now: float, timeout_s: float) -> None:
        """Take `rid` out of routing now; it leaves when its in-flight work is done."""
        m = self.members[rid]
        if m.state != READY:
            raise ValueError(f"{rid} is {m.state}, not ready")
        m.state = DRAINING
        m.drain_deadline = now + timeout_s
        self._unroute(rid)
        self._leaving.append(rid)
        self.mevents.append(MembershipEvent(now, rid, m.pool, "drain"))
        self._check_leaving(now)

    def switch_role(self, rid: str, now: float, switch_s: float, timeout_s: float) -> None:
        """Move ready `rid` to the other pool: drain its current-role work, then `switch_s`."""
        m = self.members[rid]
        if m.state != READY:
            raise ValueError(f"{rid} is {m.state}, not ready")
        m.from_pool = m.pool
        m.pool = "decode" if m.pool == "prefill" else "prefill"
        m.state = MOVING
        m.switch_s = switch_s
        m.ready_at = None
        m.drain_deadline = now + timeout_s
        self._unroute(rid)
        self._leaving.append(rid)
        self._due.append(rid)
        self.mevents.append(MembershipEvent(now, rid, m.pool, "move"))
        self._check_leaving(now)

    def recall_replica(self, rid: str, now: float) -> None:
        """A draining `rid` serves its pool again at once (a scale-up took it back): back in
        routing, no longer leaving; its in-flight work simply continues (nothing was cut)."""
        m = self.members[rid]
        if m.state != DRAINING:
            raise ValueError(f"{rid} is {m.state}, not draining")
        m.state = READY
        m.drain_deadline = None
        self._leaving.remove(rid)
        self.routing.lifecycle.set_static(rid, self.replica_static())
        self.mevents.append(MembershipEvent(now, rid, m.pool, "recall"))

    def move_draining(self, rid: str, now: float, switch_s: float) -> None:
        """A draining `rid` moves to the other pool instead of leaving: it keeps draining its
        current-role work (same deadline), then `switch_s` later serves the other pool."""
        m = self.members[rid]
        if m.state != DRAINING:
            raise ValueError(f"{rid} is {m.state}, not draining")
        m.from_pool = m.pool
        m.pool = other_pool(m.pool)
        m.state = MOVING
        m.switch_s = switch_s
        m.ready_at = None
        self._due.append(rid)
        self.mevents.append(MembershipEvent(now, rid, m.pool, "move"))
        self._check_leaving(now)

    def is_idle(self, rid: str) -> bool:
        """Holds nothing: no request, no step in flight, no held lease, nothing headed to it."""
        rep = self.by_id[rid]
        core = rep.core
        if rep.driver.in_flight is not None or core.has_unfinished() or core.requests:
            return False
        if core.stats().num_held_requests:
            return False
        return not (rep.transfers or any(n > 0 for n in rep.inbound.values()))

    def gpu_seconds(self, end: float, gpus_per_replica: dict[str, int]) -> dict[str, float]:
        """Paid replica-seconds x GPUs per pool, from `asked_at` to `left_at` (or `end`)."""
        out = {p: 0.0 for p in POOLS}
        for m in self.members.values():
            left = m.left_at if m.left_at is not None else end
            pool = m.from_pool if m.state == MOVING and m.from_pool else m.pool
            out[pool] += max(0.0, left - m.asked_at) * gpus_per_replica.get(pool, 1)
        return out

    # ------------------------------------------------------------------ internals
    def _unroute(self, rid: str) -> None:
        self.routing.lifecycle.set_static(rid, self.replica_static(healthy=False))

    def _activate_due(self, now: float) -> None:
        if not self._due:
            return
        for rid in list(self._due):
            m = self.members[rid]
            if m.ready_at is None or m.ready_at > now + _EPS:
                continue
            self._due.remove(rid)
            lifecycle = self.routing.lifecycle
            if m.state == MOVING:
                lifecycle.remove_replica(rid, now)
                rep = self.by_id[rid]
                rep.role = m.pool
                rep.inbound.clear()
                self.mevents.append(MembershipEvent(m.ready_at, rid, m.pool, "moved"))
            else:
                self.mevents.append(MembershipEvent(m.ready_at, rid, m.pool, "ready"))
            m.state = READY
            m.from_pool = None
            m.drain_deadline = None
            lifecycle.add_replica(rid, PoolName(m.pool), self.replica_static())

    def _check_leaving(self, now: float) -> None:
        if not self._leaving:
            return
        for rid in list(self._leaving):
            m = self.members[rid]
            if not self.is_idle(rid):
                if m.drain_deadline is not None and now >= m.drain_deadline - _EPS:
                    self._abort_on(rid, now)
                else:
                    continue
            self._leaving.remove(rid)
            if m.state == MOVING:
                m.drained_at = now
                m.ready_at = now + m.switch_s
                self._activate_due(now)
            else:
                m.state = REMOVED
                m.left_at = now
                rep = self.by_id[rid]
                rep.next_event = None
                self.routing.lifecycle.remove_replica(rid, now)
                self.index.remove_replica(rid)
                self.mevents.append(MembershipEvent(now, rid, m.pool, "removed"))

    def _abort_on(self, rid: str, now: float) -> None:
        """Past the drain timeout: abort every request that still needs `rid` (lost)."""
        victims = [
            rec
            for rec in self.records.values()
            if rec.decode_replica == rid or (rec.prefill_replica == rid and rec.first_token is None)
        ]
        for rec in victims:
            for rep in (self.by_id[rec.decode_replica], self.by_id.get(rec.prefill_replica or "")):
                if rep is None:
                    continue
                rep.core.abort_request(rec.request_id, now)
                rep.core.release_held(rec.request_id, now)
                self._wake(rep, now)
            leg_pending = self._pending_decode.pop(rec.request_id, None) is not None
            if rec.prefill_replica is not None and leg_pending:
                d = self.by_id[rec.decode_replica]
                p = self.by_id[rec.prefill_replica]
                d.inbound[p.index] = d.inbound.get(p.index, 0) - 1
            self.routing.lifecycle.aborted(rec.request_id, now)
            self.lost += 1
            self.lost_ids.add(rec.request_id)
            self.mevents.append(MembershipEvent(now, rid, self.members[rid].pool, "abort"))
            self._end_turn(rec, now)  # an aborted turn ends like a finished one
        rep = self.by_id[rid]
        rep.driver.in_flight = None
        rep.transfers.clear()
        rep.inbound.clear()

    # ------------------------------------------------------------------ overridden hooks
    def _arrive(self, now: float, si: int, turn: int) -> None:
        self.now = now
        self._activate_due(now)
        self.arrived += 1
        super()._arrive(now, si, turn)

    def _apply_outputs(self, rep: SimReplica, res: StepResult, now: float) -> None:
        lost = self.lost_ids
        if lost:  # a step in flight when its requests were aborted (drain timeout)
            res = replace(
                res,
                outputs=[o for o in res.outputs if o.request_id not in lost],
                new_remote_loads=[ld for ld in res.new_remote_loads if ld.request_id not in lost],
            )
        if rep.role != "prefill":
            for out in res.outputs:
                if out.is_first_token:
                    rec = self.records.get(out.request_id)
                    if rec is not None:
                        self.first_token_records.append(rec)
        else:  # a prefill leg ended: what the online fit learns prefill from (`observe.py`)
            for out in res.outputs:
                rec = self.records.get(out.request_id)
                if rec is not None:
                    rec.prefill_end = now
                    self.prefill_leg_records.append(rec)
        super()._apply_outputs(rep, res, now)

    def _apply_fast_forward(self, rep: SimReplica, ff: DecodeFastForward) -> None:
        acc = self.step_time.setdefault(rep.id, [0.0, 0])
        acc[0] += ff.end - ff.start
        acc[1] += ff.num_steps
        super()._apply_fast_forward(rep, ff)

    def _finish(self, rec: RequestRecord, rep: SimReplica, now: float) -> None:
        self.completed += 1
        self.finished_records.append(rec)
        super()._finish(rec, rep, now)

    def _on_step(self, rep: SimReplica, now: float) -> None:
        super()._on_step(rep, now)
        step = rep.driver.in_flight
        if step is not None and step.num_scheduled_tokens and self._counted.get(rep.id) is not step:
            self._counted[rep.id] = step  # a step still computing is seen again: count it once
            acc = self.step_time.setdefault(rep.id, [0.0, 0])
            acc[0] += step.duration_s
            acc[1] += 1
        if self._leaving and rep.id in self._leaving:
            self._check_leaving(now)

    def _on_transfer(self, data: tuple[int, str], now: float) -> None:
        rid = data[1]
        if rid in self.lost_ids:
            return
        super()._on_transfer(data, now)
        if self._leaving:
            self._check_leaving(now)

    def _tick(self, now: float) -> None:
        self.now = now
        self._activate_due(now)
        self._check_leaving(now)
        load = self.load
        used: dict[str, int] = {}
        routed = [
            self.by_id[m.replica_id]
            for m in self.members.values()
            if m.state not in (REMOVED, PENDING)
        ]
        for r in routed:
            st = r.core.stats()
            used[r.id] = r.blocks_capacity - st.num_free_blocks
            load.observe_metrics(
                r.id,
                now,
                num_running=st.num_running,
                num_waiting=st.num_waiting,
                kv_usage=used[r.id] / r.blocks_capacity,
                kv_capacity_blocks=r.blocks_capacity,
            )
        self.tick_times.append(now)
        self.decode_kv.append([used[r.id] for r in routed if r.role == "decode"])
        if (
            self.controller is not None
            and self.control_interval_s is not None
            and now >= self.next_control - _EPS
        ):
            self.next_control = now + self.control_interval_s
            self.controller(self, now)

    def run_dynamic(self) -> DynamicResult:
        sim = self.run()
        end = max(
            [self.now]
            + [r.finish for r in sim.requests if r.finish is not None]
            + [m.left_at for m in self.members.values() if m.left_at is not None]
        )
        return DynamicResult(
            sim=sim,
            members=list(self.members.values()),
            events=self.mevents,
            arrived=self.arrived,
            completed=self.completed,
            lost=self.lost,
            end_s=end,
        )
