"""Late binding: the pure decision (`router/late_binding.py`) and the queue around a real
`RequestLifecycle` (`router/binding_queue.py`)."""

from __future__ import annotations

from router.binding_queue import BindingQueue
from router.kv_index import KvIndex
from router.late_binding import (
    Binding,
    HeldRequest,
    LateBindingParams,
    ReplicaQueue,
    next_binding,
)
from router.lifecycle import RequestLifecycle
from router.pd_router import PdRouter
from router.policies.config import PolicyConfig, RouterPolicyConfig
from router.replica_state import ReplicaStatic, RoutingRequest
from router.token_load import TokenLoad
from router.vocabulary import PoolName

TPS = 10_000.0
ON = LateBindingParams(enabled=True)  # hold 0.5 s = 5,000 queued tokens at TPS


def q(rid: str, queued: int, healthy: bool = True) -> ReplicaQueue:
    return ReplicaQueue(rid, queued, TPS, healthy)


def held(
    rid: str,
    prompt: int,
    arrived: float = 0.0,
    order: int = 0,
    *,
    priority: int = 0,
    uncached: dict[str, int] | None = None,
    in_flight: frozenset[str] = frozenset(),
) -> HeldRequest:
    return HeldRequest(rid, prompt, arrived, order, priority, uncached, in_flight)


def test_holds_everything_while_every_replica_has_the_threshold_queued() -> None:
    busy = [q("r0", 5_000), q("r1", 9_000)]
    assert next_binding([held("a", 100)], busy, ON, 0.0) is None
    # an unhealthy replica is never free, however empty
    assert next_binding([held("a", 100)], [*busy, q("r2", 0, healthy=False)], ON, 0.0) is None


def test_the_shortest_prefill_goes_first_to_any_free_replica() -> None:
    replicas = [q("r0", 0), q("r1", 9_000)]
    got = next_binding(
        [held("long", 40_000, order=0), held("short", 800, order=1)], replicas, ON, 1.0
    )
    assert got == Binding("short", ("r0",))


def test_aging_lets_a_long_prompt_overtake_after_waiting_its_extra_prefill() -> None:
    replicas = [q("r0", 0)]
    # long: 4 s of prefill, arrived at 0; short: 0.1 s, arrives at `now`
    for now, winner in ((3.0, "short"), (4.0, "long")):
        waiting = [held("long", 40_000, 0.0, 0), held("short", 1_000, now, 1)]
        got = next_binding(waiting, replicas, ON, now)
        assert got is not None and got.request_id == winner, now
    no_aging = ON.model_copy(update={"aging": 0.0})
    got = next_binding(
        [held("long", 40_000, 0.0, 0), held("short", 1_000, 100.0, 1)], replicas, no_aging, 100.0
    )
    assert got is not None and got.request_id == "short"


def test_priority_comes_before_size() -> None:
    replicas = [q("r0", 0)]
    waiting = [held("small", 100, order=0), held("vip", 50_000, order=1, priority=5)]
    got = next_binding(waiting, replicas, ON, 0.0)
    assert got is not None and got.request_id == "vip"


def test_a_request_waits_for_the_busy_replica_that_holds_its_prefix_until_patience_runs_out() -> (
    None
):
    replicas = [q("free", 0), q("warm", 6_000)]  # warm: 0.6 s queued, holds 30k of the 32k
    req = held("r", 32_000, 0.0, 0, uncached={"free": 32_000, "warm": 2_000})
    # warm finishes it at 0.6 + 0.2 s, free at 3.2 s: wait (another request may go meanwhile)
    other = held("o", 1_000, 0.0, 1)
    got = next_binding([req, other], replicas, ON, 1.0)
    assert got is not None and got.request_id == "o"
    assert next_binding([req], replicas, ON, 1.0) is None
    got = next_binding([req], replicas, ON, 2.5)  # held past pin_patience_s (2 s)
    assert got == Binding("r", ("free",))


def test_an_in_flight_prefix_binds_the_request_to_that_replica_alone() -> None:
    replicas = [q("r0", 0), q("r1", 0)]
    req = held("r", 20_000, uncached={"r0": 20_000, "r1": 1_000}, in_flight=frozenset({"r1"}))
    assert next_binding([req], replicas, ON, 0.0) == Binding("r", ("r1",))
    # a cached prefix (no in-flight part) leaves the pick to the routing policy
    cached = held("c", 20_000, uncached={"r0": 20_000, "r1": 1_000})
    assert next_binding([cached], replicas, ON, 0.0) == Binding("c", ("r0", "r1"))


# ---- BindingQueue around a real lifecycle ----------------------------------------------------

BS = 16


def colocated(n: int = 2) -> RequestLifecycle:
    config = RouterPolicyConfig(prefill=PolicyConfig(name="token_load"))
    lc = RequestLifecycle(PdRouter(config), TokenLoad(), KvIndex("m", BS))
    for i in range(n):
        lc.add_replica(f"c{i}", PoolName.COLOCATED, ReplicaStatic(prefill_tokens_per_s=TPS))
    return lc


def rr(rid: str, prompt: int, keys: list[int] | None = None) -> RoutingRequest:
    return RoutingRequest(rid, prompt, BS, keys or [], max_tokens=4)


def test_queue_admits_at_once_while_free_then_holds_and_releases_shortest_first() -> None:
    lc = colocated(2)
    bq = BindingQueue(lc, ON)
    for rid in ("a", "b"):  # 8,000 tokens = 0.8 s each: both replicas become busy
        bq.hold(rr(rid, 8_000), 0.0)
        (got,) = bq.dispatch(0.0)
        assert got[0] == rid and got[1] is not None
    assert {lc.prefilling_on("a"), lc.prefilling_on("b")} == {"c0", "c1"}
    bq.hold(rr("long", 9_000), 0.1)
    bq.hold(rr("short", 500), 0.2)
    assert bq.dispatch(0.2) == [] and bq.held == 2
    assert not bq.has_free_replica(0.2)
    # c0 finishes a's prefill (its first token): c0 is free, the short one goes there first
    a_on = lc.prefilling_on("a")
    assert a_on is not None
    lc.tokens("a", 0.9, 1)
    assert lc.prefilling_on("a") is None
    out = bq.dispatch(0.9)
    # short (500 tokens) admitted; the replica stays free (0.05 s < 0.5 s) so long goes too
    assert [rid for rid, _ in out] == ["short", "long"]
    assert all(plan is not None and plan.decode.replica == a_on for _, plan in out)
    assert bq.held == 0 and bq.admitted == 4


def test_queue_sends_a_request_to_the_replica_computing_its_prefix() -> None:
    lc = colocated(2)
    bq = BindingQueue(lc, ON.model_copy(update={"hold_queued_s": 5.0}))
    prefix = list(range(1, 101))  # 100 blocks = 1,600 tokens
    bq.hold(rr("first", 1_600, prefix), 0.0)
    ((_, first),) = bq.dispatch(0.0)
    assert first is not None
    where = first.decode.replica
    # the index knows nothing yet (no KV events), but the prompt is being computed on `where`
    bq.hold(rr("second", 1_700, [*prefix, 101]), 0.1)
    ((_, second),) = bq.dispatch(0.1)
    assert second is not None and second.decode.replica == where
    # once both prefills ended the in-flight records are gone: the policy decides alone (the
    # index, fed by no engine here, knows no prefix; `where` decodes two sequences)
    lc.tokens("first", 0.5, 1)
    lc.tokens("second", 0.5, 1)
    bq.hold(rr("third", 1_700, [*prefix, 102]), 0.6)
    ((_, third),) = bq.dispatch(0.6)
    assert third is not None and third.decode.replica != where


def test_withdrawn_requests_are_never_admitted() -> None:
    lc = colocated(1)
    bq = BindingQueue(lc, ON)
    bq.hold(rr("big", 9_000), 0.0)
    bq.dispatch(0.0)
    bq.hold(rr("gone", 100), 0.1)
    assert bq.dispatch(0.1) == []
    assert bq.withdraw("gone") and not bq.withdraw("gone")
    lc.tokens("big", 1.0, 1)
    assert bq.dispatch(1.0) == []
    assert not lc.in_flight("gone")


def test_bench_policy_suffix_turns_late_binding_on_with_its_parameters() -> None:
    from benchmarks.fleet_sim.policies import router_config_for

    assert not router_config_for("token_load").late_binding.enabled
    cfg = router_config_for("dynamo/always+late:hold_queued_s=0.25:aging=2")
    assert cfg.prefill.name == "dynamo" and cfg.late_binding.enabled
    assert (cfg.late_binding.hold_queued_s, cfg.late_binding.aging) == (0.25, 2.0)
    assert cfg.pd.min_uncached_tokens == 0
