"""Each policy's formula on hand-built replica states (pdorch's own `token_load`:
`test_token_load_policy.py`)."""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import pytest

from router.plugins.pickers.softmax import softmax_probabilities
from router.policies.config import build_policy
from router.replica_state import ReplicaSnapshot, RoutingRequest
from tests.router.policy_inputs import BS, make, part, rep, request

# ---- round_robin / least_request -------------------------------------------------------------


def test_round_robin_cycles_over_healthy() -> None:
    policy = make("round_robin")
    replicas = [rep("a"), rep("b", healthy=False), rep("c")]
    chosen = [policy.route(request(), replicas, float(i)).chosen for i in range(5)]
    assert chosen == ["a", "c", "a", "c", "a"]
    decision = policy.pick(request(), replicas, 5.0)
    assert decision.rejected == {"b": "unhealthy"}
    # pick alone is pure: it does not advance the counter.
    assert policy.pick(request(), replicas, 6.0).chosen == decision.chosen


def test_no_healthy_replica() -> None:
    for name in [
        "round_robin",
        "least_request",
        "consistent_hash",
        "cache_aware",
        "kv_overlap",
        "llmd",
        "dynamo",
        "token_load",
        "token_load_decode",
    ]:
        decision = make(name).pick(request(), [rep("a", healthy=False)], 0.0)
        assert decision.chosen is None, name
        assert decision.rejected == {"a": "unhealthy"}


def test_least_request_router_and_engine_counts() -> None:
    replicas = [
        rep("a", requests_in_flight=3, num_running=0, num_waiting=0),
        rep("b", requests_in_flight=1, num_running=5, num_waiting=4),
        rep("c", requests_in_flight=1, num_running=2, num_waiting=0),
    ]
    assert make("least_request").pick(request(), replicas, 0.0).chosen == "b"  # tie b/c -> id
    engine = make("least_request", load="engine")
    decision = engine.pick(request(), replicas, 0.0)
    assert decision.chosen == "a"
    assert decision.scores == {"a": 0.0, "b": 9.0, "c": 2.0}


# ---- consistent_hash -------------------------------------------------------------------------


def test_consistent_hash_only_removed_replicas_keys_move() -> None:
    policy = make("consistent_hash", virtual_nodes=160)
    names = [f"r{i}" for i in range(8)]
    full = [rep(n) for n in names]
    sessions = [f"session-{i}" for i in range(4000)]
    before = {s: policy.pick(request(session_key=s), full, 0.0).chosen for s in sessions}
    # Virtual nodes spread the keys: every replica gets a fair share.
    counts = Counter(before.values())
    assert set(counts) == set(names)
    assert min(counts.values()) > 4000 / 8 * 0.6

    without = [r for r in full if r.replica_id != "r3"]
    after = {s: policy.pick(request(session_key=s), without, 1.0).chosen for s in sessions}
    moved = {s for s in sessions if before[s] != after[s]}
    assert moved == {s for s in sessions if before[s] == "r3"}
    assert all(after[s] != "r3" for s in sessions)

    # An unhealthy replica counts as removed; coming back restores the original mapping.
    flagged = [rep(n, healthy=(n != "r3")) for n in names]
    assert {s: policy.pick(request(session_key=s), flagged, 2.0).chosen for s in sessions} == after
    assert {s: policy.pick(request(session_key=s), full, 3.0).chosen for s in sessions} == before


def test_consistent_hash_fallback_without_session() -> None:
    replicas = [rep("a", requests_in_flight=4), rep("b", requests_in_flight=1)]
    decision = make("consistent_hash").pick(request(), replicas, 0.0)
    assert decision.chosen == "b"
    assert "least_request" in decision.reason
    rr = make("consistent_hash", fallback="round_robin")
    assert [rr.route(request(), replicas, 0.0).chosen for _ in range(3)] == ["a", "b", "a"]


# ---- cache_aware -----------------------------------------------------------------------------

SYSTEM = "You are a helpful assistant. " * 8


def text_request(text: str) -> RoutingRequest:
    return RoutingRequest(request_id="t", prompt_tokens=len(text) // 4, prompt_text=text)


def test_cache_aware_balanced_uses_match_then_smallest_tree() -> None:
    policy = make("cache_aware")
    replicas = [rep("a"), rep("b"), rep("c")]
    policy.on_request_routed(text_request(SYSTEM + "first question"), "b", 0.0)
    policy.on_request_routed(text_request("something else entirely " * 4), "a", 0.0)

    decision = policy.pick(text_request(SYSTEM + "second question"), replicas, 1.0)
    assert decision.chosen == "b"
    assert decision.higher_is_better
    assert decision.scores["b"] > 0.3 > decision.scores["a"]
    assert "highest match rate" in decision.reason

    # Nothing matches well: the replica with the smallest tree (c, empty) wins.
    decision = policy.pick(text_request("zzz unrelated prompt"), replicas, 1.0)
    assert decision.chosen == "c"
    assert "smallest tree" in decision.reason
    # Match rate must be strictly above the threshold (SGLang's `>`).
    strict = make("cache_aware", cache_threshold=1.0)
    strict.on_request_routed(text_request("abcd"), "a", 0.0)
    assert strict.pick(text_request("abcd"), [rep("a"), rep("b")], 1.0).chosen == "b"


def test_cache_aware_switches_to_shortest_queue_when_imbalanced() -> None:
    policy = make("cache_aware")
    policy.on_request_routed(text_request(SYSTEM + "q"), "a", 0.0)
    req = text_request(SYSTEM + "another")

    # |100 - 10| = 90 > 64 and 100 > 1.5 * 10: imbalanced -> shortest queue, cache ignored.
    hot = [rep("a", requests_in_flight=100), rep("b", requests_in_flight=10)]
    decision = policy.pick(req, hot, 1.0)
    assert decision.chosen == "b"
    assert "imbalanced" in decision.reason

    # Absolute gap 50 <= 64: balanced -> cache affinity to a despite its longer queue.
    assert (
        policy.pick(
            req, [rep("a", requests_in_flight=60), rep("b", requests_in_flight=10)], 1.0
        ).chosen
        == "a"
    )
    # Absolute gap 70 > 64 but 270 <= 1.5 * 200: balanced too (both conditions needed).
    assert (
        policy.pick(
            req, [rep("a", requests_in_flight=270), rep("b", requests_in_flight=200)], 1.0
        ).chosen
        == "a"
    )
    assert part(policy, "cache_aware").is_imbalanced([0, 65]) and not part(
        policy, "cache_aware"
    ).is_imbalanced([0, 64])

    # The tree learns in both modes: after routing to b while imbalanced, b matches too.
    policy.route(req, hot, 2.0)
    assert part(policy, "text_prefix").tree.match(SYSTEM + "another")["b"] == len(
        SYSTEM + "another"
    )


def test_cache_aware_eviction_and_replica_removal() -> None:
    policy = make("cache_aware", eviction_interval_s=10.0, max_tree_size=100)
    policy.on_request_routed(text_request("a" * 80 + "old-suffix-there"), "a", 0.0)
    policy.on_request_routed(text_request("a" * 80 + "new-suffix-here"), "a", 5.0)
    assert part(policy, "text_prefix").tree.size("a") == 80 + 16 + 15
    policy.on_request_routed(text_request("b" * 10), "b", 11.0)  # eviction interval passed
    assert part(policy, "text_prefix").tree.size("a") <= 100
    matched = part(policy, "text_prefix").tree.match("a" * 80 + "new-suffix-here")
    assert matched["a"] == 95  # the least recently used leaf ("old") went first
    policy.on_replica_removed("a", 12.0)
    assert part(policy, "text_prefix").tree.size("a") == 0 and "a" not in part(
        policy, "text_prefix"
    ).tree.match("a" * 80)


# ---- kv_overlap vs token_load: the hot-spot ------------------------------------------------


def hot_spot() -> list[ReplicaSnapshot]:
    # "hot" holds the popular 1536-token prefix and has 60k uncached tokens queued;
    # "cold" holds nothing and is idle. Prompt 1600 tokens.
    return [
        rep("hot", overlap_blocks=96, prefill_tokens_queued=60_000),
        rep("cold", overlap_blocks=0, prefill_tokens_queued=0),
    ]


def test_kv_overlap_hot_spots_where_token_load_does_not() -> None:
    req = request(1600)
    overlap = make("kv_overlap").pick(req, hot_spot(), 0.0)
    assert overlap.chosen == "hot"  # 96 blocks cached, however long the queue
    assert overlap.scores == {"hot": 96.0, "cold": 0.0}

    token = make("token_load").pick(req, hot_spot(), 0.0)
    assert token.chosen == "cold"
    # hot: (60000 + 64) / 10000 = 6.0064 s; cold: 1600 / 10000 = 0.16 s.
    assert token.scores["hot"] == pytest.approx(6.0064)
    assert token.scores["cold"] == pytest.approx(0.16)


def test_kv_overlap_ties_deterministic() -> None:
    replicas = [rep("b", overlap_blocks=3), rep("a", overlap_blocks=3), rep("c", overlap_blocks=1)]
    assert make("kv_overlap").pick(request(), replicas, 0.0).chosen == "a"


# ---- llm-d -----------------------------------------------------------------------------------


def test_llmd_abc_example() -> None:
    # llm-d's example: A 92% match & 2 queued beats C 88% & 31 queued and idle B (no match).
    req = request(1600)  # 100 blocks
    replicas = [
        rep("A", overlap_blocks=92, num_waiting=2, kv_usage=0.5),
        rep("B", overlap_blocks=0, num_waiting=0, kv_usage=0.5),
        rep("C", overlap_blocks=88, num_waiting=31, kv_usage=0.5),
    ]
    decision = make("llmd").pick(req, replicas, 0.0)
    assert decision.chosen == "A"
    assert decision.details["A"]["prefix"] == pytest.approx(0.92)
    assert decision.details["A"]["queue"] == pytest.approx(29 / 31)
    assert decision.details["B"]["queue"] == 1.0
    assert decision.details["C"]["queue"] == 0.0
    # 3*0.92 + 2*29/31 + 2*0.5
    assert decision.scores["A"] == pytest.approx(2.76 + 58 / 31 + 1.0)
    assert decision.scores["B"] == pytest.approx(0.0 + 2.0 + 1.0)
    assert decision.scores["C"] == pytest.approx(2.64 + 0.0 + 1.0)
    # Pure prefix picks A too here; with C slightly ahead on prefix it would pick C, llm-d not.
    replicas[2] = rep("C", overlap_blocks=95, num_waiting=31, kv_usage=0.5)
    assert make("kv_overlap").pick(req, replicas, 0.0).chosen == "C"
    assert make("llmd").pick(req, replicas, 0.0).chosen == "A"


def test_llmd_weights_from_config_and_normalisation() -> None:
    replicas = [rep("a", overlap_blocks=100, kv_usage=0.9), rep("b", kv_usage=0.0)]
    assert make("llmd").pick(request(), replicas, 0.0).chosen == "a"  # 3 + 2 + 0.2 vs 0 + 2 + 2
    only_kv = make("llmd", weights={"prefix": 0.0, "queue": 0.0, "kv_utilization": 1.0})
    assert only_kv.pick(request(), replicas, 0.0).chosen == "b"
    with pytest.raises(ValueError, match="unknown scorer"):
        make("llmd", weights={"latency": 1.0})
    # Equal queues: every replica gets queue score 1.0 (neutral).
    same = make("llmd").pick(request(), [rep("a", num_waiting=5), rep("b", num_waiting=5)], 0.0)
    assert {d["queue"] for d in same.details.values()} == {1.0}


# ---- dynamo ----------------------------------------------------------------------------------


def test_dynamo_cost_formula() -> None:
    req = request(1600)  # 100 blocks
    replicas = [
        rep("a", overlap_blocks=80, decode_blocks=500),
        rep("b", overlap_blocks=0, decode_blocks=100),
    ]
    decision = make("dynamo").pick(req, replicas, 0.0)
    # a: 1.0 * 20 + (500 + 100) = 620; b: 1.0 * 100 + (100 + 100) = 300
    assert decision.scores == {"a": pytest.approx(620.0), "b": pytest.approx(300.0)}
    assert decision.chosen == "b"
    heavy = make("dynamo", overlap_score_weight=10.0).pick(req, replicas, 0.0)
    # a: 10 * 20 + 600 = 800; b: 10 * 100 + 200 = 1200
    assert heavy.chosen == "a"


def test_dynamo_counts_in_flight_prefill_on_prefill_replicas() -> None:
    # P/D prefill pool: no replica ever holds decode blocks. Dynamo books the uncached tokens of
    # in-flight prefills as active prefill load, so a queue steers the next prefill away.
    req = request(1600)  # 100 blocks, prompt shares its first block everywhere
    replicas = [
        rep("p0", overlap_blocks=1, prefill_tokens_queued=16_000),
        rep("p1", overlap_blocks=1, prefill_tokens_queued=3_200),
        rep("p2", overlap_blocks=1, prefill_tokens_queued=8_000),
    ]
    decision = make("dynamo").pick(req, replicas, 0.0)
    # p1: (3200 + 1584) / 16 = 299 prefill blocks + (0 + 100) decode blocks
    assert decision.scores["p1"] == pytest.approx((3200 + 1584) / 16 + 100)
    assert decision.scores["p0"] == pytest.approx((16_000 + 1584) / 16 + 100)
    assert decision.details["p1"]["queued_prefill_tokens"] == 3200.0
    assert decision.chosen == "p1"
    # Routing a burst with the token load updated after each pick spreads it (the old cost,
    # decode blocks only, saw every prefill replica idle and sent all of them to p0).
    queued = {"p0": 0, "p1": 0, "p2": 0}
    for _ in range(9):
        snaps = [rep(r, overlap_blocks=1, prefill_tokens_queued=q) for r, q in queued.items()]
        chosen = make("dynamo").pick(req, snaps, 0.0).chosen
        assert chosen is not None
        queued[chosen] += req.uncached_tokens(1)
    assert set(queued.values()) == {3 * 1584}


def test_dynamo_tie_break_smaller_tree() -> None:
    replicas = [rep("a", cached_blocks=900), rep("b", cached_blocks=10)]
    assert make("dynamo").pick(request(), replicas, 0.0).chosen == "b"


def test_dynamo_softmax_is_deterministic_with_a_seed() -> None:
    replicas = [
        rep("a", overlap_blocks=50, decode_blocks=100),
        rep("b", overlap_blocks=0, decode_blocks=100),
        rep("c", overlap_blocks=90, decode_blocks=400),
    ]
    params: dict[str, Any] = dict(temperature=0.5, seed=1234)
    runs = []
    for _ in range(2):
        policy = make("dynamo", **params)
        runs.append([policy.route(request(), replicas, float(i)).chosen for i in range(200)])
    assert runs[0] == runs[1]
    # One draw per routed request: a pick that is not routed (explain, an unused decode pick)
    # is repeatable and leaves the sequence alone.
    policy = make("dynamo", **params)
    assert {policy.pick(request(), replicas, 0.0).chosen for _ in range(20)} == {runs[0][0]}
    # An RNG passed in works the same way.
    x = [
        make("dynamo", temperature=0.5, rng=random.Random(9)).pick(request(), replicas, 0.0).chosen
        for _ in range(3)
    ]
    assert len(set(x)) == 1
    # The lowest-cost replica is sampled most often, the others sometimes.
    counts = Counter(runs[0])
    assert counts.most_common(1)[0][0] == "a"
    assert len(counts) >= 2

    # score() reports the costs without consuming a draw: the sequence is unchanged.
    policy = make("dynamo", **params)
    first = policy.route(request(), replicas, 0.0).chosen
    for _ in range(5):
        policy.score(request(), replicas, 0.0)
    assert [first, policy.route(request(), replicas, 1.0).chosen] == runs[0][:2]

    probs = softmax_probabilities({"a": 0.0, "b": 10.0}, temperature=1.0)
    assert probs["a"] == pytest.approx(1 / (1 + math.exp(-1.0)))
    assert softmax_probabilities({"a": 5.0, "b": 5.0}, 0.7) == {"a": 0.5, "b": 0.5}


def test_text_prefix_tree_matches_brute_force() -> None:
    from router.text_prefix_tree import TextPrefixTree

    rng = random.Random(3)
    tree = TextPrefixTree()
    sent: dict[str, list[str]] = {"a": [], "b": [], "c": []}
    for step in range(300):
        tenant = rng.choice("abc")
        text = "".join(rng.choice("xyz") for _ in range(rng.randrange(0, 12)))
        tree.insert(text, tenant, float(step))
        sent[tenant].append(text)
        probe = "".join(rng.choice("xyz") for _ in range(rng.randrange(1, 12)))
        expected = {}
        for t, texts in sent.items():
            best = 0
            for s in texts:
                n = 0
                while n < min(len(s), len(probe)) and s[n] == probe[n]:
                    n += 1
                best = max(best, n)
            if best:
                expected[t] = best
        got = {t: n for t, n in tree.match(probe).items() if n}
        assert got == expected
    # Sizes count distinct characters of each tenant's strings (the trie's share).
    for t, texts in sent.items():
        prefixes = {s[:i] for s in texts for i in range(1, len(s) + 1)}
        assert tree.size(t) == len(prefixes)


def test_burst_on_hot_prefix_token_load_spreads_kv_overlap_piles() -> None:
    """40 requests sharing a 3072-token prefix cached on r0 only, arriving together."""
    from router.replica_state import build_snapshots
    from router.token_load import TokenLoad

    def run(policy_name: str) -> tuple[dict[str, int], float]:
        policy = make(policy_name)
        load = TokenLoad()
        ids = ["r0", "r1", "r2", "r3"]
        routed: Counter[str] = Counter()
        for i in range(40):
            req = RoutingRequest(request_id=f"q{i}", prompt_tokens=4096, block_size=BS)
            snaps = build_snapshots(ids, {"r0": 192}, load, 0.0)
            decision = policy.route(req, snaps, 0.0)
            assert decision.chosen is not None
            overlap = 192 if decision.chosen == "r0" else 0
            load.on_admitted(
                req.request_id,
                decision.chosen,
                0.0,
                prompt_tokens=4096,
                uncached_tokens=req.uncached_tokens(overlap),
                block_size=BS,
                decodes=False,
            )
            routed[decision.chosen] += 1
        makespan = max(load.load(r, 0.0).prefill_tokens_queued for r in ids) / 10_000
        return dict(routed), makespan

    overlap_routed, overlap_makespan = run("kv_overlap")
    token_routed, token_makespan = run("token_load")
    assert overlap_routed == {"r0": 40}
    assert overlap_makespan == pytest.approx(40 * 1024 / 10_000)  # 4.1 s on one replica
    assert set(token_routed) == {"r0", "r1", "r2", "r3"}
    assert token_routed["r0"] > token_routed["r1"]  # the cache still pays where it is
    # Fluid optimum: all four finish together, T * 10k * (1/1024 + 3/4096) = 40 -> 2.34 s.
    optimum = 40 / (10_000 * (1 / 1024 + 3 / 4096))
    assert token_makespan < overlap_makespan * 0.65
    assert token_makespan <= optimum * 1.1


def test_role_filter_keeps_the_configured_pools() -> None:
    profile = build_policy(
        {
            "name": "decode_or_colocated",
            "filters": [{"name": "health"}, {"name": "role", "params": {"roles": ["decode"]}}],
            "scorers": [{"name": "least_request"}],
        }
    )
    replicas = [
        rep("p0", role="prefill"),
        rep("d0", role="decode", requests_in_flight=5),
        rep("x", requests_in_flight=9),  # role not given: kept
        rep("d1", role="decode", healthy=False),
    ]
    decision = profile.pick(request(), replicas, 0.0)
    assert decision.chosen == "d0"
    assert decision.rejected == {"p0": "role prefill not in ['decode']", "d1": "unhealthy"}
    strict = build_policy(
        {
            "name": "decode_only",
            "filters": [{"name": "role", "params": {"roles": ["decode"], "keep_unknown": False}}],
            "scorers": [{"name": "least_request"}],
        }
    )
    assert strict.pick(request(), [rep("x"), rep("p", role="prefill")], 0.0).chosen is None
    assert "no candidate left by role" in strict.pick(request(), [rep("x")], 0.0).reason


def test_softmax_picker_reads_the_profiles_direction() -> None:
    # llm-d's scorers (higher is better) under a sampling picker: the best total is drawn
    # most often, and a fixed seed gives the same sequence.
    config = {
        "name": "llmd_sampled",
        "scorers": [{"name": "prefix", "weight": 3}, {"name": "kv_utilization", "weight": 2}],
        "picker": {"name": "softmax", "params": {"temperature": 0.3, "seed": 5}},
    }
    replicas = [rep("a", overlap_blocks=100), rep("b", kv_usage=0.9), rep("c", kv_usage=0.5)]
    runs = []
    for _ in range(2):
        profile = build_policy(config)
        runs.append([profile.route(request(), replicas, float(i)).chosen for i in range(300)])
    assert runs[0] == runs[1]
    counts = Counter(runs[0])
    assert counts["a"] > counts["c"] > counts["b"]
    decision = build_policy(config).pick(request(), replicas, 0.0)
    assert decision.higher_is_better
    assert decision.details["a"]["probability"] > decision.details["b"]["probability"]


def test_tie_break_must_name_a_snapshot_field() -> None:
    with pytest.raises(ValueError, match="not a replica snapshot field"):
        build_policy(
            {
                "name": "token_load",
                "picker": {"name": "max_score", "params": {"tie_break": ["-speed"]}},
            }
        )
