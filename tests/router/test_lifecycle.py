"""`RequestLifecycle`: routing and token load through a request's events (pure, no I/O)."""

from __future__ import annotations

from router.approx_index import ApproxKvIndex
from router.kv_index import KvIndex
from router.lifecycle import RequestLifecycle
from router.lifecycle_plan import DecodeLeg, EventKind, KvLookup, LifecycleEvent, PrefillLeg
from router.pd_decision import PdDecisionParams
from router.pd_router import PdRouter
from router.policies.config import PolicyConfig, RouterPolicyConfig
from router.replica_state import ReplicaLoad, ReplicaStatic, RoutingRequest
from router.token_load import TokenLoad
from router.vocabulary import PoolName, RouteKind

BS = 16


def lifecycle(
    prefill: int = 1,
    decode: int = 2,
    colocated: int = 0,
    *,
    approx: ApproxKvIndex | None = None,
    recorder: list[LifecycleEvent] | None = None,
    min_uncached: int = 32,
) -> RequestLifecycle:
    config = RouterPolicyConfig(
        prefill=PolicyConfig(name="token_load"),
        decode=PolicyConfig(name="token_load_decode"),
        pd=PdDecisionParams(min_uncached_tokens=min_uncached),
    )
    lc = RequestLifecycle(
        PdRouter(config), TokenLoad(), KvIndex("m", BS), approx, recorder=recorder
    )
    for pool, n, tag in (
        (PoolName.PREFILL, prefill, "p"),
        (PoolName.DECODE, decode, "d"),
        (PoolName.COLOCATED, colocated, "c"),
    ):
        for i in range(n):
            lc.add_replica(f"{tag}{i}", pool, approximate=approx is not None)
    return lc


def req(rid: str, prompt: int, keys: int = 0) -> RoutingRequest:
    return RoutingRequest(rid, prompt, BS, list(range(1, keys + 1)), max_tokens=8)


def load(lc: RequestLifecycle, replica: str) -> tuple[int, int, int]:
    got = lc.token_load.tracked_load(replica)
    return got.prefill_tokens_queued, got.decode_blocks, got.requests_in_flight


def test_pd_decode_side_holds_the_prompt_blocks_from_admission_and_no_prefill_tokens() -> None:
    lc = lifecycle()
    lookup = KvLookup({"p0": 2, "d0": 3}, {})
    plan = lc.admit(req("r", 100, keys=6), 0.0, lookup=lookup)
    assert plan.kind is RouteKind.PD
    assert plan.prefill == PrefillLeg("p0", 100 - 2 * BS)
    assert plan.decode == DecodeLeg("d0", True, 0, RouteKind.PD, "p0")
    assert load(lc, "p0") == (68, 0, 1)
    assert load(lc, "d0") == (0, 7, 1)  # ceil(100 / 16) blocks, whatever it caches
    leg = lc.prefill_done("r", 1.0, ok=True)
    assert leg == DecodeLeg("d0", True, 0, RouteKind.PD, "p0")
    assert load(lc, "p0") == (0, 0, 0)
    lc.kv_landed("r", 1.5)
    assert load(lc, "d0") == (0, 7, 1)  # landing changes nothing
    lc.tokens("r", 2.0, 1)
    assert load(lc, "d0") == (0, 7, 1)
    lc.tokens("r", 2.1, 13)  # 113 tokens: 8 blocks
    assert load(lc, "d0") == (0, 8, 1)
    lc.finished("r", 3.0)
    assert load(lc, "d0") == (0, 0, 0) and not lc.in_flight("r")


def test_the_reservation_steers_the_next_decode_pick() -> None:
    lc = lifecycle()
    first = lc.admit(req("a", 400), 0.0, lookup=KvLookup({}, {}))
    second = lc.admit(req("b", 400), 0.0, lookup=KvLookup({}, {}))
    assert first.decode.replica != second.decode.replica  # before either prefill returned


def test_failed_prefill_falls_back_to_local_prefill_of_the_decode_side() -> None:
    lc = lifecycle()
    lc.admit(req("r", 100), 0.0, lookup=KvLookup({"d0": 2}, {}))
    leg = lc.prefill_done("r", 1.0, ok=False)
    assert leg == DecodeLeg("d0", False, 100 - 2 * BS, RouteKind.FALLBACK, "d0")
    assert load(lc, "p0") == (0, 0, 0)
    assert load(lc, "d0") == (68, 0, 1)
    assert lc.prefill_done("r", 1.1, ok=True) is None  # only once
    lc.tokens("r", 2.0, 1)
    assert load(lc, "d0") == (0, 7, 1)
    lc.aborted("r", 3.0)
    assert load(lc, "d0") == (0, 0, 0)


def test_short_prompt_is_local_and_counts_its_uncached_tokens_until_the_first_token() -> None:
    lc = lifecycle()
    plan = lc.admit(req("r", 20), 0.0, lookup=KvLookup({}, {}))
    assert plan.kind is RouteKind.LOCAL and plan.prefill is None
    assert plan.decode == DecodeLeg("d0", False, 20, RouteKind.LOCAL, "d0")
    assert load(lc, "d0") == (20, 0, 1)
    lc.tokens("r", 1.0, 1)
    assert load(lc, "d0") == (0, 2, 1)  # 21 tokens


def test_decode_retry_keeps_the_kv_unless_the_failed_engine_was_reached() -> None:
    lc = lifecycle(decode=3)
    lc.admit(req("r", 100), 0.0, lookup=KvLookup({}, {}))
    lc.prefill_done("r", 1.0, ok=True)
    lc.decode_failed("r", 1.1, reached=False)
    assert load(lc, "d0") == (0, 0, 0)
    leg = lc.retry_decode("r", 1.2)
    assert leg == DecodeLeg("d1", True, 0, RouteKind.PD, "p0")
    assert load(lc, "d1") == (0, 7, 1)
    lc.decode_failed("r", 1.3, reached=True)  # it may have claimed the blocks
    leg = lc.retry_decode("r", 1.4)
    assert leg == DecodeLeg("d2", False, 100, RouteKind.FALLBACK, "d2")
    assert load(lc, "d2") == (100, 0, 1) and load(lc, "d1") == (0, 0, 0)
    lc.decode_failed("r", 1.5, reached=False)
    assert lc.retry_decode("r", 1.6) is None  # every decode replica tried


def test_retry_goes_to_the_colocated_pool_when_no_decode_replica_is_left() -> None:
    lc = lifecycle(decode=1, colocated=1)
    lc.admit(req("r", 100), 0.0, lookup=KvLookup({}, {}))
    lc.prefill_done("r", 1.0, ok=True)
    lc.decode_failed("r", 1.1, reached=True)
    assert lc.retry_decode("r", 1.2) == DecodeLeg("c0", False, 100, RouteKind.FALLBACK, "c0")


def test_health_is_data_and_unhealthy_replicas_are_not_picked() -> None:
    lc = lifecycle()
    lc.set_static("d0", ReplicaStatic(healthy=False))
    plan = lc.admit(req("r", 100), 0.0, lookup=KvLookup({}, {}))
    assert plan.decode.replica == "d1"
    routed = lc.route(req("x", 100), 0.0, lookup=KvLookup({}, {}), commit=False)
    assert [s.healthy for s in routed.decode] == [False, True]


def test_approximate_replicas_remember_what_was_routed_to_them() -> None:
    approx = ApproxKvIndex()
    lc = lifecycle(approx=approx)
    lc.admit(req("a", 100, keys=6), 0.0)
    look = lc.lookup(list(range(1, 7)), 1.0)
    assert look.overlap == {"p0": 6, "d0": 6}
    assert look.cached_blocks["p0"] == 6 and look.cached_blocks["d1"] == 0


def test_members_in_natural_order_and_removal_forgets_load() -> None:
    lc = lifecycle(decode=0)
    for i in (10, 2, 1):
        lc.add_replica(f"d{i}", PoolName.DECODE)
    assert lc.members(PoolName.DECODE) == ["d1", "d2", "d10"]
    plan = lc.admit(req("r", 20), 0.0, lookup=KvLookup({}, {}))
    lc.remove_replica(plan.decode.replica, 1.0)
    assert plan.decode.replica not in lc.members(PoolName.DECODE)
    assert lc.token_load.tracked_load(plan.decode.replica) == ReplicaLoad()


def test_recorder_sees_every_event_with_its_inputs_and_the_load_after() -> None:
    trace: list[LifecycleEvent] = []
    lc = lifecycle(recorder=trace)
    lookup = KvLookup({"p0": 1}, {})
    lc.admit(req("r", 100), 0.0, lookup=lookup)
    lc.prefill_done("r", 1.0, ok=True)
    lc.kv_landed("r", 1.1)
    lc.tokens("r", 1.2, 1)
    lc.tokens("r", 1.3, 2)  # same blocks: not forwarded, not recorded
    lc.finished("r", 2.0)
    assert [e.kind for e in trace] == [
        EventKind.ADMITTED,
        EventKind.PREFILL_DONE,
        EventKind.KV_LANDED,
        EventKind.TOKENS,
        EventKind.FINISHED,
    ]
    admitted = trace[0]
    assert admitted.lookup == lookup and admitted.static["d0"] == ReplicaStatic()
    assert admitted.loads["p0"] == ReplicaLoad(84, 0, 1)
    assert trace[-1].loads == {rid: ReplicaLoad() for rid in ("p0", "d0", "d1")}


def test_migrate_ends_the_dead_replicas_entry_once_and_admits_prompt_plus_output_elsewhere() -> (
    None
):
    trace: list[LifecycleEvent] = []
    lc = lifecycle(recorder=trace)
    lookup = KvLookup({"p0": 2, "d1": 1}, {})
    lc.admit(req("r", 100, keys=6), 0.0, lookup=lookup)
    lc.prefill_done("r", 1.0, ok=True)
    lc.tokens("r", 1.1, 1)
    lc.tokens("r", 1.2, 40)  # 140 tokens: 9 blocks on d0
    assert load(lc, "d0") == (0, 9, 1)
    leg = lc.migrate("r", 1.3, 40)
    # d1 prefills the 140-token sequence less the one block it caches of the prompt
    assert leg == DecodeLeg("d1", False, 140 - BS, RouteKind.PD, "d1")
    assert load(lc, "d0") == (0, 0, 0)
    assert load(lc, "d1") == (140 - BS, 0, 1)
    lc.tokens("r", 1.4, 1)  # the continuation's first output: its prompt is computed
    assert load(lc, "d1") == (0, 9, 1)  # ceil(141 / 16)
    assert trace[-2].kind is EventKind.MIGRATED and trace[-2].generated == 40
    assert lc.migrate("r", 1.5, 3) is None  # d0 and d1 tried: nobody left
    assert load(lc, "d1") == (0, 0, 0) and lc.in_flight("r")
    lc.aborted("r", 1.6)
    assert all(load(lc, r) == (0, 0, 0) for r in ("p0", "d0", "d1")) and not lc.in_flight("r")


def test_eligible_replicas_alone_serve_in_every_pool_and_on_retries() -> None:
    """`RoutingRequest.eligible` (a LoRA request: the replicas with its adapter)."""
    lc = lifecycle(prefill=2, decode=3)
    only = frozenset({"p1", "d1", "d2"})
    request = RoutingRequest("r", 100, BS, [1, 2, 3, 4, 5, 6], max_tokens=8, eligible=only)
    # the idle, lowest ids would win without the restriction
    plan = lc.admit(request, 0.0, lookup=KvLookup({"p0": 6, "d0": 6}, {}))
    assert plan.prefill is not None and plan.prefill.replica == "p1"
    assert plan.decode.replica in {"d1", "d2"}
    first = plan.decode.replica
    lc.prefill_done("r", 1.0, ok=True)
    lc.decode_failed("r", 1.5, reached=False)
    retry = lc.retry_decode("r", 2.0)
    assert retry is not None and retry.replica == ({"d1", "d2"} - {first}).pop()
    lc.decode_failed("r", 2.5, reached=False)
    assert lc.retry_decode("r", 3.0) is None  # d0 is never a candidate
    # nobody eligible in the prefill pool: the decode replica prefills itself
    local = lc.admit(
        RoutingRequest("s", 100, BS, [], max_tokens=8, eligible=frozenset({"d0"})), 4.0
    )
    assert local.prefill is None and local.decode.replica == "d0"
