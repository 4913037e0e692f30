"""The straggler-aware decode signal: remaining output tokens per replica, from the token load
to `token_load`'s `remaining_decode` term (router/plugins/scorers/token_load.py)."""

from __future__ import annotations

from typing import Any

import pytest

from router.kv_index import KvIndex
from router.lifecycle import RequestLifecycle
from router.lifecycle_plan import KvLookup
from router.pd_router import PdRouter
from router.plugins.scorers.token_load import TokenLoadParams
from router.policies.config import PolicyConfig, RouterPolicyConfig, build_policy
from router.replica_state import ReplicaSnapshot, RoutingRequest
from router.token_load import TokenLoad
from router.vocabulary import PoolName

BS = 16
TPS = 10_000.0
C = 1e-7


def request(prompt: int, max_tokens: int | None, rid: str = "req") -> RoutingRequest:
    return RoutingRequest(rid, prompt, BS, tuple(range(prompt // BS)), max_tokens=max_tokens)


def scorer(**params: Any) -> Any:
    base: dict[str, Any] = dict(
        decode_s_per_kv_token=C,
        default_prefill_tokens_per_s=TPS,
        remaining_decode=False,  # each test sets it
    )
    return build_policy(PolicyConfig(name="token_load", params={**base, **params}))


def rep(rid: str, decoding: tuple[tuple[int, int], ...], **kw: Any) -> ReplicaSnapshot:
    blocks = sum(b for _, b in decoding)
    return ReplicaSnapshot(
        rid, decode_blocks=blocks, requests_in_flight=len(decoding), decoding=decoding, **kw
    )


# ---- the signal: TokenLoad ------------------------------------------------------------------


def test_token_load_reports_remaining_output_per_decoding_sequence() -> None:
    tl = TokenLoad()
    tl.on_admitted("a", "r", 0.0, prompt_tokens=160, uncached_tokens=160, block_size=BS,
                   max_tokens=100)  # fmt: skip
    tl.on_admitted("b", "r", 0.0, prompt_tokens=32, uncached_tokens=32, block_size=BS)
    tl.on_admitted("p", "r", 0.0, prompt_tokens=64, uncached_tokens=64, block_size=BS,
                   decodes=False, max_tokens=1)  # fmt: skip
    # a: 100 to go, 0 blocks while it prefills; b: no max_tokens (-1); p: prefill-only, absent
    assert tl.load("r", 0.0).decoding == ((-1, 0), (100, 0))
    tl.on_tokens("a", "r", 1.0, 40)
    assert tl.load("r", 1.0).decoding == ((-1, 0), (60, 13))  # ceil(200 / 16) blocks
    tl.on_tokens("a", "r", 2.0, 130)  # past its bound (a client's stop may differ): floor 0
    assert tl.load("r", 2.0).decoding[1][0] == 0
    tl.on_finished("a", 3.0)
    assert tl.load("r", 3.0).decoding == ((-1, 0),)


def test_reservations_carry_max_tokens_and_the_signal_travels_in_deltas() -> None:
    a, b = TokenLoad(origin="a"), TokenLoad(origin="b")
    a.on_reserved("r", "d", 0.0, prompt_tokens=320, block_size=BS, max_tokens=500)
    a.on_leg_sent("r", "d", 1.0)
    a.on_tokens("r", "d", 2.0, 200)
    assert a.load("d", 2.0).decoding == ((300, 33),)
    for delta in a.export_deltas():
        b.apply_delta(delta, 2.0)
    assert b.load("d", 2.0).decoding == ((300, 33),)


def test_the_lifecycle_feeds_max_tokens_and_streamed_tokens() -> None:
    config = RouterPolicyConfig()  # colocated picks use the prefill policy (token_load)
    lc = RequestLifecycle(PdRouter(config), TokenLoad(), KvIndex("m", BS))
    lc.add_replica("c0", PoolName.COLOCATED)
    lc.admit(request(64, 1000, rid="x"), 0.0, lookup=KvLookup({}, {}))
    lc.tokens("x", 1.0, 1)
    lc.tokens("x", 2.0, 300)  # 364 tokens: a new block, so the token load hears of it
    (snap,) = lc.snapshots(PoolName.COLOCATED, KvLookup({}, {}), 2.0)
    assert snap.decoding == ((700, 23),)


# ---- the scorer -----------------------------------------------------------------------------


def test_remaining_decode_formula() -> None:
    # r decodes a long sequence (5000 to go, 100 blocks) and a nearly done one (10, 50 blocks).
    r = rep("r", ((10, 50), (5000, 100)))
    req = request(320, max_tokens=1000)  # out = min(1000, expected_output_tokens 256)
    got = scorer(remaining_decode=True, peer_weight=0.5).pick(req, [r], 0.0)
    step = 1 / TPS
    own = 10 * (step + C * 50 * BS) + 256 * (step + C * 100 * BS)
    peers = (10 + 256) * (step + C * 320)
    assert got.details["r"]["decode_s"] == pytest.approx(own + 0.5 * peers)
    # A horizon of 1000 (expected_output_tokens): the long one shares all 1000 steps.
    wide = scorer(remaining_decode=True, expected_output_tokens=1000).pick(req, [r], 0.0)
    own = 10 * (step + C * 50 * BS) + 1000 * (step + C * 100 * BS)
    assert wide.details["r"]["decode_s"] == pytest.approx(own)


def test_without_max_tokens_it_is_the_step_model_term() -> None:
    # Nobody gave max_tokens: every sequence is taken to outlive ours, as the plain term does.
    r = rep("r", ((-1, 300), (-1, 700)))
    req = request(320, max_tokens=None)
    plain = scorer().pick(req, [r], 0.0).details["r"]
    aware = scorer(remaining_decode=True, peer_weight=0.0).pick(req, [r], 0.0).details["r"]
    assert aware["decode_s"] == pytest.approx(plain["decode_s"])
    assert aware["prefill_s"] == pytest.approx(plain["prefill_s"])


def test_a_short_turn_avoids_the_replica_of_a_long_decode() -> None:
    # "lone" runs one straggler with 6000 tokens to go; "busy" runs three turns that end within
    # 50 tokens. The plain term counts sequences (1 < 3) and joins the straggler for all 256
    # steps of its horizon; the remaining-decode term sees that busy's batch empties at once.
    lone = rep("lone", ((6000, 600),))
    busy = rep("busy", ((20, 200), (40, 200), (50, 200)))
    req = request(2048, max_tokens=1024)
    assert scorer().pick(req, [lone, busy], 0.0).chosen == "lone"
    for weight in (0.0, 1.0):
        aware = scorer(remaining_decode=True, peer_weight=weight)
        assert aware.pick(req, [lone, busy], 0.0).chosen == "busy"


def test_a_long_decode_goes_where_the_batch_ends_soonest() -> None:
    # Equal batches of two; "a"'s sequences have 900 tokens left each, "b"'s 100 each. Over
    # its 256-step horizon a straggler turn (8192 tokens) shares 2 x 256 steps on a, 2 x 100
    # on b: b. The plain term, blind to what remains, ties.
    a = rep("a", ((900, 100), (900, 100)))
    b = rep("b", ((100, 100), (100, 100)))
    req = request(2048, max_tokens=8192)
    assert scorer().pick(req, [a, b], 0.0).scores["a"] == pytest.approx(
        scorer().pick(req, [a, b], 0.0).scores["b"]
    )
    assert scorer(remaining_decode=True).pick(req, [a, b], 0.0).chosen == "b"


def test_prefill_replicas_see_no_decode_term() -> None:
    # A P/D prefill pool: prefill-only legs never enter `decoding`, so the term is 0.
    p = ReplicaSnapshot("p", prefill_tokens_queued=5000)
    got = scorer(remaining_decode=True).pick(request(320, max_tokens=100), [p], 0.0)
    assert got.details["p"]["decode_s"] == 0.0
    assert got.scores["p"] == pytest.approx((5000 + 320) / TPS)


def test_the_token_load_profile_turns_on_both_the_scorer_keeps_them_off() -> None:
    # Defaults since 2026-12-03: per-replica cost on (sim-route-defaults); the straggler-aware
    # term on once its sum became array operations (router-straggler-vec). The scorer's own
    # defaults stay off, so a config naming the scorer with its own params is unchanged.
    params = build_policy(PolicyConfig(name="token_load")).scorers[0][0].params
    assert params.per_replica_decode_cost
    assert params.remaining_decode
    assert not TokenLoadParams().remaining_decode
    assert not TokenLoadParams().per_replica_decode_cost


def test_decode_kv_without_listed_sequences_keeps_the_plain_term() -> None:
    # A replica whose decode KV this router did not route (a scrape, a peer) lists no
    # sequences: the straggler-aware term must not price its batch as free.
    req = request(320, max_tokens=100)
    r = ReplicaSnapshot("r", decode_blocks=50, requests_in_flight=4)
    plain = scorer().pick(req, [r], 0.0).details["r"]["decode_s"]
    aware = scorer(remaining_decode=True).pick(req, [r], 0.0).details["r"]["decode_s"]
    assert plain > 0.0
    assert aware == plain
