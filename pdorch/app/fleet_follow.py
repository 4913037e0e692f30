"""Fleet events → the coordinator's router state (`Coordinator` subscribes this to its fleet).

`ReplicaAdded` → follow its KV events, make it a lifecycle member (and, once the coordinator
runs, learn its LoRA adapters); `ReplicaRemoved` → stop following, drop its index entries, token
load and policy state; `ReplicaHealthChanged` → candidate health (an unhealthy replica's waiting
legs and `/tokenize` calls are hung up, so they move elsewhere); `ReplicaMetricsUpdated` →
`TokenLoad.observe_metrics` (reconciliation) and, at most once a second, the hash-match check.

Split from `state.py` (which owns the state and its loops) so that each module keeps one job.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from pools.fleet import (
    FleetEvent,
    ReplicaAdded,
    ReplicaHealthChanged,
    ReplicaMetricsUpdated,
    ReplicaRemoved,
)
from pools.replica import Replica, ReplicaState
from router.kv_event_subscriber import EngineEventSource
from router.replica_state import ReplicaStatic
from router.vocabulary import PoolName

if TYPE_CHECKING:
    from pdorch.app.state import Coordinator

log = logging.getLogger("pdorch.app.state")  # these lines were always the coordinator's


def static_of(replica: Replica) -> ReplicaStatic:
    """The router's statics of a replica: health, and the routing constants of its
    hardware profile (fleet file `hardware:`, pools/hardware.py; None without one)."""
    ep = replica.endpoint
    return ReplicaStatic(
        healthy=replica.routable,
        prefill_tokens_per_s=ep.prefill_tokens_per_s,
        decode_s_per_kv_token=ep.decode_s_per_kv_token,
    )


def follow_fleet_event(c: Coordinator, event: FleetEvent) -> None:
    """Apply one fleet event to `c`'s router state (the module docstring)."""
    replica = event.replica
    rid = replica.replica_id
    if isinstance(event, ReplicaAdded):
        ep = replica.endpoint
        c.lifecycle.add_replica(
            rid,
            PoolName(replica.pool),
            static_of(replica),
            approximate=ep.kv_events_endpoint is None,
        )
        if c.running:  # a replica joining later: learn its adapters now
            poll = asyncio.get_running_loop().create_task(c.adapter_poller.poll(rid, replica.url))
            c.adapter_polls.add(poll)
            poll.add_done_callback(c.adapter_polls.discard)
        if ep.kv_events_endpoint is not None:
            c.subscriber.add_engine(
                EngineEventSource(
                    rid, ep.kv_events_endpoint, ep.kv_events_replay_endpoint, ep.kv_events_topic
                )
            )
    elif isinstance(event, ReplicaRemoved):
        c.lifecycle.remove_replica(rid, event.now)
        c.subscriber.remove_engine(rid)
        c.index.remove_replica(rid)
        c.approx.remove_replica(rid)
        c.adapters.remove(rid)
        c.tokens.forget(replica.url)
    elif isinstance(event, ReplicaHealthChanged):
        c.lifecycle.set_static(rid, static_of(replica))
        if event.new is ReplicaState.UNHEALTHY:
            c.waiting_legs.cut(rid, event.reason)
            c.tokens.hang_up(replica.url)  # a hung engine's /tokenize calls too
        log.info("replica %s: %s → %s (%s)", rid, event.old, event.new, event.reason)
    elif isinstance(event, ReplicaMetricsUpdated):
        if event.now - c.hash_checked_at >= 1.0:  # piggy-backs on the scrape loop
            c.hash_checked_at = event.now
            c.hash_monitor.evaluate(c.index, event.now)
        m = event.metrics
        c.token_load.observe_metrics(
            rid,
            event.now,
            num_running=m.num_running,
            num_waiting=m.num_waiting,
            kv_usage=m.kv_usage,
            kv_capacity_blocks=m.num_gpu_blocks or replica.endpoint.num_gpu_blocks or 0,
        )
