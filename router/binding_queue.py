"""`BindingQueue`: the held requests and the in-flight prefixes around one `RequestLifecycle`,
the state `router/late_binding.py`'s decision reads. The coordinator (`pdorch/app/state.py`)
and the fleet simulator (`benchmarks/fleet_sim/simulator.py`) both drive it; no clock, no I/O.

    hold(request, now, priority)   the request waits (nothing is counted on any replica yet)
    dispatch(now)                  while `next_binding` names one: `lifecycle.admit` it with its
                                   prefill restricted to the binding's replicas → [(id, plan)]
                                   (plan None: no replica can serve it, the caller answers 503)
    withdraw(request_id)           a held request left (client gone, deadline)
    has_free_replica(now)          whether a `dispatch` can admit anything (cheap: no lookups)

Call `dispatch` after anything that can free a replica of the prefilling pool: an arrival, a
prefill's end (the prefill leg's return, a local prefill's first token), a finish or abort, a
metrics scrape (the token load may drop stale entries), a replica joining.

**In-flight prefixes.** Each admitted request's block keys are remembered on the replica that
computes its prompt while `lifecycle.prefilling_on` names that replica (its PD prefill leg runs,
or its local prefill has produced no token). A held request's uncached tokens on a replica are
then its prompt less the longer of the index's overlap and its leading blocks found among that
replica's in-flight keys: the blocks exist there as soon as that prefill ends, so the request
should wait for that replica rather than recompute them elsewhere (`late_binding.py`).

The index lookups are redone at each `dispatch` round (once per held request per round: the
index changes between rounds), which is why `has_free_replica` lets the caller skip rounds
that cannot admit.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from router.late_binding import (
    HeldRequest,
    LateBindingParams,
    ReplicaQueue,
    free_replicas,
    next_binding,
)
from router.lifecycle import RequestLifecycle
from router.lifecycle_plan import RequestPlan
from router.pd_router import NoReplicaError
from router.replica_state import RoutingRequest
from router.vocabulary import PoolName


@dataclass(slots=True)
class _Held:
    request: RoutingRequest
    priority: int
    arrived: float
    order: int


class BindingQueue:
    """Held requests + in-flight prefixes for late binding (module docstring)."""

    def __init__(self, lifecycle: RequestLifecycle, params: LateBindingParams) -> None:
        self.lifecycle = lifecycle
        self.params = params
        self._held: dict[str, _Held] = {}
        self._order = itertools.count()
        # request id -> (replica computing its prompt, its block keys)
        self._in_flight: dict[str, tuple[str, tuple[int, ...]]] = {}
        # counters for reports and tests: admitted, admitted later than they arrived, and the
        # most requests still held after a dispatch
        self.admitted = 0
        self.delayed = 0
        self.max_held = 0

    @property
    def held(self) -> int:
        return len(self._held)

    def is_held(self, request_id: str) -> bool:
        return request_id in self._held

    def hold(self, request: RoutingRequest, now: float, priority: int = 0) -> None:
        self._held[request.request_id] = _Held(request, priority, now, next(self._order))

    def withdraw(self, request_id: str) -> bool:
        """A held request leaves; False when it was not held (already admitted)."""
        return self._held.pop(request_id, None) is not None

    def prefilling_pool(self) -> PoolName | None:
        """The pool whose queues decide holding: prefill, else colocated (None: neither)."""
        members = self.lifecycle.pools.members
        if members(PoolName.PREFILL):
            return PoolName.PREFILL
        if members(PoolName.COLOCATED):
            return PoolName.COLOCATED
        return None

    def queues(self, now: float) -> list[ReplicaQueue]:
        pool = self.prefilling_pool()
        if pool is None:
            return []
        lc = self.lifecycle
        default = self.params.default_prefill_tokens_per_s
        out = []
        for rid in lc.pools.members(pool):
            static = lc.pools.static(rid)
            load = lc.token_load.load(rid, now)
            out.append(
                ReplicaQueue(
                    rid,
                    load.prefill_tokens_queued,
                    static.prefill_tokens_per_s or default,
                    static.healthy,
                )
            )
        return out

    def has_free_replica(self, now: float) -> bool:
        return bool(free_replicas(self.queues(now), self.params))

    def dispatch(self, now: float) -> list[tuple[str, RequestPlan | None]]:
        """Admit every held request the decision lets go now (module docstring)."""
        out: list[tuple[str, RequestPlan | None]] = []
        if not self._held:
            return out
        pool = self.prefilling_pool()
        lc = self.lifecycle
        if pool is None:  # nothing prefills apart from the serving replicas: no holding
            for rid in list(self._held):
                out.append((rid, self._admit(self._held.pop(rid).request, now, None)))
            return out
        queues = self.queues(now)
        if not free_replicas(queues, self.params):
            return out
        self._prune()
        members = lc.pools.members(pool)
        # one index lookup per held request and round; in-flight prefixes change as we admit
        overlaps = {
            rid: lc.lookup(h.request.block_keys, now).overlap for rid, h in self._held.items()
        }
        candidates: dict[str, HeldRequest] = {}
        for rid, h in self._held.items():
            candidates[rid] = self._candidate(h, members, overlaps[rid])
        while candidates:
            binding = next_binding(list(candidates.values()), queues, self.params, now)
            if binding is None:
                break
            rid = binding.request_id
            del candidates[rid]
            held = self._held.pop(rid)
            out.append((rid, self._admit(held.request, now, binding.replicas)))
            if now > held.arrived:
                self.delayed += 1
            queues = self.queues(now)
            if rid in self._in_flight:  # its prompt is in flight now: others may share it
                for other in candidates:
                    candidates[other] = self._candidate(self._held[other], members, overlaps[other])
        self.max_held = max(self.max_held, len(self._held))
        return out

    # ---- internals ---------------------------------------------------------------------------

    def _admit(
        self, request: RoutingRequest, now: float, only: tuple[str, ...] | None
    ) -> RequestPlan | None:
        try:
            plan = self.lifecycle.admit(request, now, only=only)
        except NoReplicaError:
            return None
        self.admitted += 1
        rid = request.request_id
        computing = plan.prefill.replica if plan.prefill is not None else plan.decode.replica
        if request.block_keys:
            self._in_flight[rid] = (computing, tuple(request.block_keys))
        return plan

    def _prune(self) -> None:
        """Forget in-flight prompts whose prefill ended (the index has their blocks)."""
        prefilling_on = self.lifecycle.prefilling_on
        for rid, (replica, _) in list(self._in_flight.items()):
            if prefilling_on(rid) != replica:
                del self._in_flight[rid]

    def _candidate(self, h: _Held, members: list[str], overlap: Mapping[str, int]) -> HeldRequest:
        req = h.request
        keys = req.block_keys
        uncached: dict[str, int] = {}
        in_flight: set[str] = set()
        flying = self._flying_prefix(keys) if self._in_flight else {}
        for rid in members:
            blocks = overlap.get(rid, 0)
            fly = flying.get(rid, 0)
            if fly > blocks:
                blocks = fly
                in_flight.add(rid)
            uncached[rid] = req.uncached_tokens(blocks)
        return HeldRequest(
            req.request_id,
            req.prompt_tokens,
            h.arrived,
            h.order,
            h.priority,
            uncached,
            frozenset(in_flight),
        )

    def _flying_prefix(self, keys: Sequence[int]) -> dict[str, int]:
        """Per replica: the leading blocks of `keys` some in-flight prompt there shares."""
        out: dict[str, int] = {}
        if not keys:
            return out
        for replica, theirs in self._in_flight.values():
            n = 0
            for a, b in zip(keys, theirs, strict=False):
                if a != b:
                    break
                n += 1
            if n > out.get(replica, 0):
                out[replica] = n
        return out
