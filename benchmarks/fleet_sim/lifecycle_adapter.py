"""The fleet simulator's side of `RequestLifecycle` (router/lifecycle.py): the one place where
what happens in the simulated fleet becomes a lifecycle event.

The coordinator drives the same lifecycle from real HTTP legs; the simulator's happenings map
onto the same events:

    arrival, routed                      → admit               (plan: who prefills, who decodes)
    prefill core's leg output            → prefill_done(ok)    (no simulated leg fails yet)
    KV transfer into the decode core     → kv_landed
    a decode core's output tokens        → tokens(cumulative)
    last token                           → finished

`build_sim_lifecycle` is how the simulator makes its lifecycle (pools from `FleetSpec`'s
replica ids and roles, per-replica statics); the agreement test builds one the same way and
replays the coordinator's recorded events through `SimLifecycle`
(tests/coordinator/test_lifecycle_agreement.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from router.kv_index import KvIndex
from router.lifecycle import RequestLifecycle
from router.lifecycle_plan import DecodeLeg, KvLookup, LifecycleEvent, RequestPlan
from router.pd_router import PdRouter
from router.policies.config import RouterPolicyConfig
from router.replica_state import ReplicaStatic, RoutingRequest
from router.token_load import TokenLoad
from router.vocabulary import PoolName


def build_sim_lifecycle(
    router_config: RouterPolicyConfig,
    replicas: Iterable[tuple[str, str]],
    static: Mapping[str, ReplicaStatic],
    index: KvIndex,
    *,
    seed: int = 0,
    recorder: list[LifecycleEvent] | None = None,
) -> RequestLifecycle:
    """The simulator's lifecycle: `replicas` as (id, role), role a pool name."""
    lifecycle = RequestLifecycle(
        PdRouter(router_config, seed=seed), TokenLoad(origin="sim"), index, recorder=recorder
    )
    for rid, role in replicas:
        lifecycle.add_replica(rid, PoolName(role), static.get(rid, ReplicaStatic()))
    return lifecycle


class SimLifecycle:
    """What each simulated happening tells the lifecycle (module docstring)."""

    def __init__(self, lifecycle: RequestLifecycle) -> None:
        self.lifecycle = lifecycle
        self.token_load = lifecycle.token_load

    def arrive(
        self, request: RoutingRequest, now: float, lookup: KvLookup | None = None
    ) -> RequestPlan:
        """A request arrived: route and admit it (`lookup`: the index answer, when the
        caller has it already; the simulator lets the lifecycle ask its index)."""
        return self.lifecycle.admit(request, now, lookup=lookup)

    def prefill_leg_done(self, request_id: str, now: float) -> DecodeLeg:
        """The prefill core finished the leg: the decode leg to submit."""
        leg = self.lifecycle.prefill_done(request_id, now, ok=True)
        if leg is None:
            raise RuntimeError(f"prefill leg {request_id}: not a P/D request in flight")
        return leg

    def prefill_leg_failed(self, request_id: str, now: float) -> DecodeLeg:
        """The prefill replica failed the leg (no simulated engine does yet; replicas that go
        away will): the decode replica prefills itself."""
        leg = self.lifecycle.prefill_done(request_id, now, ok=False)
        if leg is None:
            raise RuntimeError(f"prefill leg {request_id}: not a P/D request in flight")
        return leg

    def transfer_landed(self, request_id: str, now: float) -> None:
        self.lifecycle.kv_landed(request_id, now)

    def token_output(self, request_id: str, now: float, generated_total: int) -> None:
        self.lifecycle.tokens(request_id, now, generated_total)

    def finished(self, request_id: str, now: float, generated_total: int | None = None) -> None:
        self.lifecycle.finished(request_id, now, generated_total)
