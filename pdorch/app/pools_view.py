"""`GET /admin/pools`' view of the coordinator: every pool's replicas with health, load, KV
usage and hit rate, the KV-event subscriber, the peers' sync and the hash-match monitor.

Split from `state.py` (proxy-7, code health: below ~500 lines); unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdorch.app.state import Coordinator


def pools_view(c: Coordinator) -> dict[str, Any]:
    """`GET /admin/pools`: every pool's replicas with health, load, KV usage and hit rate."""
    now = c.clock()
    pools: dict[str, Any] = {}
    for pool in sorted(set(c.fleet.pools()) | {"prefill", "decode"}):
        replicas = []
        for r in c.fleet.replicas(pool):
            load = c.token_load.load(r.replica_id, now)
            m = r.metrics
            replicas.append(
                {
                    "id": r.replica_id,
                    "url": r.url,
                    "metrics_url": r.endpoint.metrics_endpoint,
                    "kind": r.endpoint.kind,
                    "launched": r.endpoint.launched,
                    "state": r.state.value,
                    "routable": r.routable,
                    "state_since_s": round(now - r.state_since, 3),
                    "consecutive_failures": r.consecutive_failures,
                    "last_error": r.last_error,
                    "load": {
                        "prefill_tokens_queued": load.prefill_tokens_queued,
                        "decode_blocks": load.decode_blocks,
                        "requests_in_flight": load.requests_in_flight,
                    },
                    "kv_usage": m.kv_usage if m else None,
                    "num_running": m.num_running if m else None,
                    "num_waiting": m.num_waiting if m else None,
                    "kv_capacity_blocks": (m.num_gpu_blocks if m else None)
                    or r.endpoint.num_gpu_blocks,
                    "prefix_hit_rate": m.prefix_hit_rate if m else None,
                    "metrics_age_s": round(now - m.scraped_at, 3) if m else None,
                    "kv_events": r.endpoint.kv_events_endpoint,
                    "indexed_blocks": c.approx.blocks(r.replica_id)
                    if c.lifecycle.is_approximate(r.replica_id)
                    else c.index.blocks(r.replica_id),
                }
            )
        pools[pool] = {
            "policy": _policy_name(c, pool),
            "routable": sum(1 for r in replicas if r["routable"]),
            "replicas": replicas,
        }
    return {
        "served_model_name": c.served_model,
        "block_size": c.block_size,
        "origin": c.origin,
        "requests_in_flight": c.in_flight,
        "requests_queued": c.admission.queued,
        "tracked_requests": c.token_load.tracked_requests(),
        "tokenizer": c.tokens.mode,
        "pools": pools,
        "kv_events": c.subscriber.metrics(),
        "sync": _sync_view(c),
        "hash_match": {
            "ratio": c.hash_monitor.match_ratio,
            "healthy": c.hash_monitor.healthy,
            **c.hash_monitor.counters.as_dict(),
        },
    }


def _sync_view(c: Coordinator) -> dict[str, Any] | None:
    if c.sync is None:
        return None
    try:
        endpoint: str | None = c.sync.endpoint
    except RuntimeError:  # not started (or stopped)
        endpoint = None
    return {
        "endpoint": endpoint,
        "peers": c.sync.peers(),
        **dataclasses.asdict(c.sync.stats),
    }


def _policy_name(c: Coordinator, pool: str) -> str:
    policy = {
        "prefill": c.router.prefill_policy,
        "decode": c.router.decode_policy,
    }.get(pool, c.router.colocated_policy)
    return policy.name
