"""`PdRouter`: prefill pick + P/D decision + decode pick, and the token-free KvIndex mode."""

from __future__ import annotations

from router.kv_events import BlockRemoved, BlockStored
from router.kv_index import KvIndex
from router.pd_router import PdRouter
from router.policies.config import load_router_config
from router.replica_state import ReplicaSnapshot, RoutingRequest

# A replica state: its id, then any field by keyword (the snapshot's own typed signature).
snap = ReplicaSnapshot


def test_long_uncached_prompt_is_disaggregated_and_short_one_is_not() -> None:
    router = PdRouter(load_router_config({}))
    prefill = [snap("p0", prefill_tokens_queued=5000), snap("p1")]
    decode = [
        snap("d0", decode_blocks=50, kv_capacity_blocks=1000),
        snap("d1", kv_capacity_blocks=1000),
    ]
    long = RoutingRequest("a", prompt_tokens=4000, block_size=16, max_tokens=100)
    route = router.route(long, prefill, decode, now=1.0)
    assert route.disaggregate and route.kind == "pd"
    assert route.prefill_replica == "p1" and route.decode_replica == "d1"
    short = RoutingRequest("b", prompt_tokens=100, block_size=16, max_tokens=100)
    route = router.route(short, prefill, decode, now=1.0)
    assert not route.disaggregate and route.prefill_replica is None and route.kind == "local"
    explained = route.explain(short, 1.0, prefill, decode)
    assert explained.pd is not None and not explained.pd.disaggregate
    assert explained.decode is not None and explained.decode.chosen == route.decode_replica


def test_colocated_fleet_uses_the_prefill_policy_and_never_policy_keeps_local() -> None:
    router = PdRouter(load_router_config({"prefill": {"name": "kv_overlap"}}))
    colocated = [snap("c0"), snap("c1", overlap_blocks=10)]
    req = RoutingRequest("a", prompt_tokens=4000, block_size=16)
    route = router.route(req, [], [], now=0.0, colocated=colocated)
    assert route.kind == "colocated" and route.decode_replica == "c1"
    never = PdRouter(load_router_config({"pd": {"enabled": False}}))
    route = never.route(req, [snap("p0")], [snap("d0")], now=0.0)
    assert not route.disaggregate and route.decode_replica == "d0"


def test_uncommitted_route_leaves_stateful_policies_unchanged() -> None:
    cfg = load_router_config(
        {"prefill": {"name": "round_robin"}, "decode": {"name": "round_robin"}}
    )
    router = PdRouter(cfg)
    req = RoutingRequest("a", prompt_tokens=4000, block_size=16)
    p, d = [snap("p0"), snap("p1")], [snap("d0"), snap("d1")]
    first = router.route(req, p, d, now=0.0, commit=False)
    again = router.route(req, p, d, now=0.0)
    assert (first.prefill_replica, first.decode_replica) == (
        again.prefill_replica,
        again.decode_replica,
    )
    third = router.route(req, p, d, now=0.0)
    assert third.prefill_replica != again.prefill_replica


def test_kv_index_keys_token_free_events_by_engine_hash() -> None:
    idx = KvIndex("m", 64, engine_hash_keys=True)
    idx.apply(
        "r0",
        [
            BlockStored(
                block_hashes=[11, 12, 13],
                parent_block_hash=None,
                token_ids=[],
                block_size=64,
                medium="GPU",
            )
        ],
    )
    idx.apply(
        "r1",
        [
            BlockStored(
                block_hashes=[11], parent_block_hash=None, token_ids=[], block_size=64, medium="GPU"
            )
        ],
    )
    assert idx.match([11, 12, 13, 14]) == {"r0": 3, "r1": 1}
    idx.apply("r0", [BlockRemoved(block_hashes=[12], medium="GPU")])
    assert idx.match([11, 12, 13]) == {"r0": 1, "r1": 1}
    plain = KvIndex("m", 64)  # default: events without token ids are skipped, as before
    plain.apply(
        "r0",
        [
            BlockStored(
                block_hashes=[11], parent_block_hash=None, token_ids=[], block_size=64, medium="GPU"
            )
        ],
    )
    assert plain.match([11]) == {} and plain.counters.skipped_blocks == 1
