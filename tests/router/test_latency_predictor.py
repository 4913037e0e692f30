"""Issue 15: per-replica profile constants in `token_load`, the learnt latency fit
(router/latency_predictor.py), and the `latency_predictor` scorer that reads it."""

from __future__ import annotations

import random
from typing import Any

import pytest

from router.kv_index import KvIndex
from router.latency_predictor import LatencyFitParams, LatencyPredictor, prior_prefill_s
from router.lifecycle import RequestLifecycle
from router.pd_decision import PdDecisionParams
from router.pd_router import PdRouter
from router.plugins.spec import ProfileError
from router.policies.config import PolicyConfig, RouterPolicyConfig, build_policy
from router.replica_columns import ReplicaColumns
from router.replica_state import LatencyEstimate, ReplicaSnapshot, ReplicaStatic, RoutingRequest
from router.token_load import TokenLoad
from router.vocabulary import PoolName, RouteKind

BS = 16
TPS = 10_000.0
H100_C = 3.9e-8  # KV bytes per token / HBM bandwidth, 8B bf16 (token_load's docstring)
H200_C = 2.7e-8


def request(prompt: int, out: int | None = 256, rid: str = "req") -> RoutingRequest:
    return RoutingRequest(rid, prompt, BS, tuple(range(prompt // BS)), max_tokens=out)


# token_load's profile turns both on (2026-12-03); these tests set each flag they study.
PLAIN = {"token_load": {"remaining_decode": False, "per_replica_decode_cost": False}}


def policy(name: str, **params: Any) -> Any:
    return build_policy(PolicyConfig(name=name, params={**PLAIN.get(name, {}), **params}))


# ---- 1. per-replica constants (token_load@per_replica_decode_cost) --------------------------


def mixed_pool() -> list[ReplicaSnapshot]:
    """The same work on an H100 and an H200 replica: 20 sequences, 200k KV tokens each."""
    return [
        ReplicaSnapshot(
            rid,
            prefill_tokens_queued=4096,
            decode_blocks=200_000 // BS,
            requests_in_flight=20,
            prefill_tokens_per_s=TPS,
            decode_s_per_kv_token=c,
        )
        for rid, c in (("h100", H100_C), ("h200", H200_C))
    ]


def test_mixed_pool_prices_the_same_work_lower_on_h200() -> None:
    own = policy("token_load", per_replica_decode_cost=True)
    got = own.pick(request(2048), mixed_pool(), 0.0)
    assert got.chosen == "h200"
    assert got.scores["h200"] < got.scores["h100"]
    # the decode term scales with the replica's own c: out · (n / tps + c · K)
    kv = 200_000
    want = 256 * (20 / TPS + H200_C * kv) - 256 * (20 / TPS + H100_C * kv)
    diff = got.scores["h200"] - got.scores["h100"]
    # the prefill's per-step KV read differs too (steps · (c200 - c100) · K)
    steps = -(-(4096 + 2048) // (8192 - 20))
    assert diff == pytest.approx(want + steps * (H200_C - H100_C) * kv, rel=1e-9)


def test_without_the_flag_every_replica_gets_the_global_constant() -> None:
    plain = policy("token_load").pick(request(2048), mixed_pool(), 0.0)
    assert plain.scores["h100"] == plain.scores["h200"]
    # a replica without a profile falls back to the global constant with the flag too
    snaps = mixed_pool()
    snaps[1].decode_s_per_kv_token = None
    own = policy("token_load", per_replica_decode_cost=True).pick(request(2048), snaps, 0.0)
    assert own.scores["h200"] == plain.scores["h200"]


@pytest.mark.parametrize("n", [3, 40])  # the scalar rows and the array path
def test_columns_give_the_snapshot_scores_bit_for_bit(n: int) -> None:
    rng = random.Random(n)
    snaps = [
        ReplicaSnapshot(
            f"r{i}",
            overlap_blocks=rng.randrange(0, 64),
            prefill_tokens_queued=rng.randrange(0, 30_000),
            decode_blocks=rng.choice([0, rng.randrange(1, 20_000)]),
            requests_in_flight=rng.randrange(0, 64),
            prefill_tokens_per_s=rng.choice([None, 12_000.0]),
            decode_s_per_kv_token=rng.choice([None, H100_C, H200_C]),
        )
        for i in range(n)
    ]
    scorer = policy("token_load", per_replica_decode_cost=True).scorers[0][0]
    req = request(900)
    want = scorer.score(req, snaps, 0.0).scores
    cols = ReplicaColumns.of(snaps)
    import numpy as np

    got = scorer.score_columns(req, cols, np.arange(n), 0.0).values.tolist()
    assert got == [want[s.replica_id] for s in snaps]


# ---- 2. the learnt fit ----------------------------------------------------------------------


def feed_prefills(pred: LatencyPredictor, replica: str, slow: float, n: int, t0: float) -> float:
    """`n` prefills on `replica` that take `slow` x the model's estimate (+ 20 ms)."""
    rng = random.Random(replica)
    t = t0
    for i in range(n):
        prior = rng.uniform(0.05, 2.0)
        rid = f"{replica}-{i}"
        pred.admitted(rid, replica, t, prior)
        t += 0.02 + slow * prior
        assert pred.prefill_done(rid, t) == replica
        pred.forget(rid)
    return t


def test_a_replica_twice_as_slow_is_learnt_as_twice_within_ten_observations() -> None:
    pred = LatencyPredictor()
    assert pred.estimate("slow") is None
    feed_prefills(pred, "slow", 2.0, 10, 0.0)
    feed_prefills(pred, "fast", 1.0, 10, 0.0)
    slow, fast = pred.estimate("slow"), pred.estimate("fast")
    assert slow is not None and fast is not None
    assert slow.prefill_observations == 10
    assert slow.prefill_ratio == pytest.approx(2.0, rel=0.08)
    assert fast.prefill_ratio == pytest.approx(1.0, rel=0.08)
    assert slow.prefill_ratio / fast.prefill_ratio == pytest.approx(2.0, rel=0.1)
    assert 0.0 <= fast.prefill_intercept_s < 0.05  # the 20 ms per request


def test_prior_holds_with_one_observation_and_old_observations_fade() -> None:
    pred = LatencyPredictor(LatencyFitParams(half_life_s=10.0))
    pred.admitted("a", "r", 0.0, 0.5)
    pred.prefill_done("a", 5.0)  # one observation at 10x: the ridge keeps it near the model
    one = pred.estimate("r")
    assert one is not None and 1.0 < one.prefill_ratio < 4.0
    t = feed_prefills(pred, "r", 3.0, 30, 10.0)  # the replica slows down to 3x ...
    assert _ratio(pred, "r") == pytest.approx(3.0, rel=0.1)
    feed_prefills(pred, "r", 1.0, 30, t + 100.0)  # ... and recovers: 10 half-lives later, 1x
    assert _ratio(pred, "r") == pytest.approx(1.0, rel=0.1)


def _ratio(pred: LatencyPredictor, replica_id: str) -> float:
    fit = pred.estimate(replica_id)
    assert fit is not None
    return fit.prefill_ratio


def test_ratio_is_clamped() -> None:
    pred = LatencyPredictor(LatencyFitParams(max_ratio=4.0))
    feed_prefills(pred, "r", 50.0, 20, 0.0)
    assert _ratio(pred, "r") == 4.0


def test_decode_fit_learns_the_step_time_ratio() -> None:
    pred = LatencyPredictor()
    t = 0.0
    for i in range(20):
        x = 0.0005 + 0.0025 * (i % 5)  # the model's per-step slow-down, 0.5-10.5 ms
        pred.admitted(f"q{i}", "d", t, 0.1)
        pred.prefill_done(f"q{i}", t + 0.1)
        pred.decode_started(f"q{i}", "d", t + 0.1, x)
        t += 0.1 + 99 * (0.004 + 2.0 * x)  # 4 ms base step + 2x the modelled slow-down
        assert pred.finished(f"q{i}", t, 100) == "d"
    est = pred.estimate("d")
    assert est is not None and est.decode_observations == 20
    assert est.decode_ratio == pytest.approx(2.0, rel=0.1)
    assert est.decode_intercept_s == pytest.approx(0.004, rel=0.2)


def test_single_token_answers_and_forgotten_requests_are_not_decode_observations() -> None:
    pred = LatencyPredictor()
    pred.admitted("a", "d", 0.0, 0.1)
    pred.decode_started("a", "d", 0.1, 0.001)
    assert pred.finished("a", 0.2, 1) is None
    pred.admitted("b", "d", 0.0, 0.1)
    pred.forget("b")
    assert pred.prefill_done("b", 0.3) is None
    assert pred.estimate("d") is None


def test_prior_prefill_is_token_loads_prefill_term() -> None:
    snap = ReplicaSnapshot("r", prefill_tokens_queued=20_000, decode_blocks=1000,
                           requests_in_flight=30)  # fmt: skip
    terms = policy("token_load", decode_s_per_kv_token=H100_C).scorers[0][0]
    got = terms.score(request(5000), [snap], 0.0).terms["r"]["prefill_s"]
    assert prior_prefill_s(25_000, 30, 1000 * BS, TPS, H100_C, 8192) == got
    assert prior_prefill_s(25_000, 0, 0, TPS, H100_C, 8192) == 2.5


# ---- 3. the scorer -------------------------------------------------------------------------


def test_scorer_without_observations_is_token_load_with_per_replica_constants() -> None:
    rng = random.Random(7)
    snaps = [
        ReplicaSnapshot(
            f"r{i}",
            overlap_blocks=rng.randrange(0, 64),
            prefill_tokens_queued=rng.randrange(0, 30_000),
            decode_blocks=rng.choice([0, rng.randrange(1, 20_000)]),
            requests_in_flight=rng.randrange(1, 64),
            prefill_tokens_per_s=12_000.0,
            decode_s_per_kv_token=rng.choice([H100_C, H200_C]),
        )
        for i in range(12)
    ]
    req = request(3000)
    want = policy("token_load", per_replica_decode_cost=True).pick(req, snaps, 0.0).scores
    got = policy("latency_predictor").pick(req, snaps, 0.0).scores
    assert got == pytest.approx(want, rel=1e-12)


def test_scorer_moves_work_off_a_replica_learnt_slow() -> None:
    snaps = [ReplicaSnapshot(rid, prefill_tokens_queued=q, prefill_tokens_per_s=TPS)
             for rid, q in (("a", 8000), ("b", 12_000))]  # fmt: skip
    lp = policy("latency_predictor")
    assert lp.pick(request(4000), snaps, 0.0).chosen == "a"  # less work queued
    snaps[0].latency = LatencyEstimate(prefill_ratio=2.0, prefill_observations=10)
    got = lp.pick(request(4000), snaps, 0.0)
    assert got.chosen == "b"  # a's 12k tokens at 2x cost more than b's 16k at 1x
    assert got.scores["a"] == pytest.approx(2 * 12_000 / TPS)
    assert got.details["a"]["prefill_ratio"] == 2.0
    assert "x 1.00" in got.reason  # b's account: its model estimate, unscaled


def test_learnt_decode_ratio_is_read_only_when_asked() -> None:
    fit = LatencyEstimate(decode_ratio=3.0, decode_observations=5)
    snap = ReplicaSnapshot("r", decode_blocks=1000, requests_in_flight=10,
                           prefill_tokens_per_s=TPS, decode_s_per_kv_token=H200_C,
                           latency=fit)  # fmt: skip
    base = 256 * (10 / TPS + H200_C * 1000 * BS)
    plain = policy("latency_predictor").pick(request(64), [snap], 0.0).details["r"]
    learnt = policy("latency_predictor", learnt_decode=True).pick(request(64), [snap], 0.0)
    assert plain["decode_s"] == pytest.approx(base)
    assert learnt.details["r"]["decode_s"] == pytest.approx(3 * base)


def test_bad_fit_parameter_names_the_field() -> None:
    with pytest.raises(ProfileError, match="half_life_s"):
        policy("latency_predictor", half_life_s=0)


# ---- 4. the lifecycle feeds the fit from its events ------------------------------------------


def lifecycle(policy_name: str, pd: bool) -> RequestLifecycle:
    config = RouterPolicyConfig(
        prefill=PolicyConfig(name=policy_name),
        decode=PolicyConfig(name="token_load_decode"),
        pd=PdDecisionParams(min_uncached_tokens=32 if pd else 10**9),
    )
    lc = RequestLifecycle(PdRouter(config), TokenLoad(), KvIndex("m", BS))
    static = ReplicaStatic(prefill_tokens_per_s=TPS, decode_s_per_kv_token=H200_C)
    for rid, pool in (("p0", PoolName.PREFILL), ("p1", PoolName.PREFILL), ("d0", PoolName.DECODE)):
        lc.add_replica(rid, pool, static)
    return lc


def test_lifecycle_keeps_no_fit_for_policies_that_do_not_read_one() -> None:
    assert lifecycle("token_load", pd=True).predictor is None


def test_lifecycle_learns_a_slow_prefill_replica_and_routes_around_it() -> None:
    lc = lifecycle("latency_predictor", pd=True)
    t = 0.0
    # p0 runs at half its profiled speed: every prefill leg takes 2x what the model says
    for i in range(8):
        rid = f"r{i}"
        plan = lc.admit(request(4000, 32, rid), t)
        assert plan.kind is RouteKind.PD and plan.prefill is not None
        slow = 2.0 if plan.prefill.replica == "p0" else 1.0
        t += slow * 4000 / TPS
        lc.prefill_done(rid, t, ok=True)
        lc.tokens(rid, t + 0.01, 1)
        lc.finished(rid, t + 0.01 + 31 * 0.005, 32)
        t += 1.0
    p0 = lc.pools.static("p0").latency
    p1 = lc.pools.static("p1").latency
    assert p0 is not None and p1 is not None
    # one slow leg on p0 is enough to move the next ones to p1 (equal queues otherwise)
    assert p0.prefill_observations == 1 and p0.prefill_ratio > 1.1
    assert p1.prefill_observations == 7 and p1.prefill_ratio == pytest.approx(1.0, abs=0.02)
    d0 = lc.pools.static("d0").latency
    assert d0 is not None and d0.decode_observations == 8
    # the caller's later statics keep the fit, and the snapshots carry it
    lc.set_static("p0", ReplicaStatic(prefill_tokens_per_s=TPS, decode_s_per_kv_token=H200_C))
    assert lc.pools.static("p0").latency is p0
    lookup = lc.lookup((), t)
    snaps = {s.replica_id: s for s in lc.snapshots(PoolName.PREFILL, lookup, t)}
    assert snaps["p0"].latency is p0
    # with equal queues now, the next prefill goes to the replica learnt fast
    leg = lc.admit(request(4000, 32, "next"), t).prefill
    assert leg is not None and leg.replica == "p1"


def test_local_prefill_is_observed_at_the_first_token() -> None:
    lc = lifecycle("latency_predictor", pd=False)
    plan = lc.admit(request(4000, 8, "x"), 0.0)
    assert plan.kind is not RouteKind.PD
    lc.tokens("x", 0.8, 1)
    est = lc.pools.static(plan.decode.replica).latency
    assert est is not None and est.prefill_observations == 1
    lc.aborted("x", 1.0)
    assert lc.pools.static(plan.decode.replica).latency is est  # aborts are not observed


# ---- 5. KV-transfer-aware decode pick (token_load_decode@transfer_weight) ------------------


def decode_pool() -> list[ReplicaSnapshot]:
    """Two decode replicas: `held` decoded the session's last turn (holds 12k of the prompt's
    16k tokens) and carries 100 blocks (1 % of its KV) more than `empty`."""
    return [
        ReplicaSnapshot("held", overlap_blocks=12_000 // BS, decode_blocks=1100,
                        kv_capacity_blocks=10_000),
        ReplicaSnapshot("empty", overlap_blocks=0, decode_blocks=1000, kv_capacity_blocks=10_000),
    ]  # fmt: skip


def test_transfer_term_prefers_the_replica_holding_the_prompt() -> None:
    req = request(16_000, 64)
    assert policy("token_load_decode").pick(req, decode_pool(), 0.0).chosen == "empty"
    aware = policy("token_load_decode", transfer_weight=2.0).pick(req, decode_pool(), 0.0)
    assert aware.chosen == "held"
    terms = aware.details
    assert terms["held"]["transfer_s"] == pytest.approx(4000 * 3.3e-6)
    assert terms["empty"]["transfer_s"] == pytest.approx(16_000 * 3.3e-6)
    # 2 x 12k tokens x 3.3 µs = 0.079 of transfer saved against 0.01 of KV load
    diff = aware.scores["empty"] - aware.scores["held"]
    assert diff == pytest.approx(2.0 * 12_000 * 3.3e-6 - 100 / 10_000, rel=1e-9)
    assert "KV transfer 13.2 ms" in aware.reason


def test_bench_policy_decode_params_reach_the_decode_policy() -> None:
    from benchmarks.fleet_sim.policies import router_config_for

    config = router_config_for("token_load+decode:transfer_weight=2")
    assert config.decode.params == {"transfer_weight": 2}
    assert router_config_for("latency_predictor").prefill.name == "latency_predictor"
    with pytest.raises(ValueError, match="known: late, decode"):
        router_config_for("token_load+nope")
