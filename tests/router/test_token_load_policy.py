"""pdorch's `token_load` policy (prefill and decode profiles): its formula on hand-built replica
states."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.router.policy_inputs import make, rep, request


def test_token_load_prefill_formula() -> None:
    req = request(3200)  # 200 blocks
    replicas = [
        # A pure prefill replica (no decode blocks): t = W / tps, nothing else.
        rep(
            "a",
            overlap_blocks=100,
            prefill_tokens_queued=2000,
            prefill_tokens_per_s=20_000.0,
        ),
        # (0 + 3200) / 10000 (default)
        rep("b"),
        # (8000 + 0) / 10000
        rep("c", overlap_blocks=200, prefill_tokens_queued=8000),
    ]
    decision = make("token_load").pick(req, replicas, 0.0)
    assert decision.scores["a"] == pytest.approx((2000 + 1600) / 20_000)
    assert decision.scores["b"] == pytest.approx(0.32)
    assert decision.scores["c"] == pytest.approx(0.8)
    assert decision.chosen == "a"
    assert make("token_load").score(req, replicas, 0.0) == decision.scores
    assert decision.details["a"]["decode_s"] == 0.0
    assert decision.details["a"]["steps"] == 0.0  # no decode batch: no per-step terms


def test_token_load_step_model_on_a_colocated_replica() -> None:
    # A colocated replica decoding 10 sequences holding 1000 blocks (16,000 KV tokens).
    req = request(3200, max_tokens=100)  # out = min(100, 256) = 100
    busy = rep(
        "busy",
        overlap_blocks=100,
        prefill_tokens_queued=14_000,
        decode_blocks=1000,
        requests_in_flight=10,
    )
    params: dict[str, Any] = dict(max_num_batched_tokens=8192, decode_s_per_kv_token=1e-7)
    decision = make("token_load", **params).pick(req, [busy], 0.0)
    work = 14_000 + 1600  # queued + uncached
    steps = math.ceil(work / (8192 - 10))  # each step's budget is shared with 10 decodes
    read = 1e-7 * 16_000  # the decode batch's KV read, every step
    prefill = (work + steps * 10) / 10_000 + steps * read
    decode = 100 * (10 / 10_000 + read)
    assert steps == 2
    assert decision.details["busy"]["prefill_s"] == pytest.approx(prefill)
    assert decision.details["busy"]["decode_s"] == pytest.approx(decode)
    assert decision.scores["busy"] == pytest.approx(prefill + decode)
    # Without max_tokens the request is expected to decode expected_output_tokens (256).
    no_max = make("token_load", **params).pick(request(3200), [busy], 0.0)
    assert no_max.details["busy"]["decode_s"] == pytest.approx(256 * (10 / 10_000 + read))


def test_token_load_heavy_decode_batch_loses_despite_overlap() -> None:
    # Colocated: "home" holds 7680 of the 8000 prompt tokens but decodes 16 sequences over
    # 6000 blocks (96k KV tokens); "light" holds nothing and decodes 2 short sequences.
    req = request(8000, max_tokens=1024)
    home = rep("home", overlap_blocks=480, decode_blocks=6000, requests_in_flight=16)
    light = rep("light", overlap_blocks=0, decode_blocks=200, requests_in_flight=2)
    tps = {"prefill_tokens_per_s": 30_000.0}
    home.prefill_tokens_per_s = light.prefill_tokens_per_s = tps["prefill_tokens_per_s"]
    decision = make("token_load").pick(req, [home, light], 0.0)
    # home: prefill 320 tokens (one step reading 96k KV tokens), then 1024 decode steps next to
    # 16 sequences / 96k KV tokens; light: re-prefills 8000 tokens, decodes next to 3.2k.
    assert decision.chosen == "light"
    assert decision.details["home"]["prefill_s"] < decision.details["light"]["prefill_s"]
    assert decision.details["home"]["decode_s"] > decision.details["light"]["decode_s"]
    # kv_overlap (and the old prefill-only view) keep the request on its home replica.
    assert make("kv_overlap").pick(req, [home, light], 0.0).chosen == "home"
    # With nothing to decode beside it (a short answer), the cache wins again.
    short = make("token_load").pick(request(8000, max_tokens=1), [home, light], 0.0)
    assert short.chosen == "home"


def test_token_load_pure_prefill_replicas_ignore_the_decode_terms() -> None:
    # P/D prefill pool: no decode blocks anywhere; the decode parameters change nothing.
    req = request(3200, max_tokens=4096)
    replicas = [
        rep("p0", overlap_blocks=150, prefill_tokens_queued=30_000, requests_in_flight=40),
        rep("p1", overlap_blocks=0, prefill_tokens_queued=1_000, requests_in_flight=1),
    ]
    variants: tuple[dict[str, Any], ...] = (
        dict(),
        dict(decode_s_per_kv_token=1e-3, expected_output_tokens=100_000),
        dict(decode_s_per_kv_token=0.0, max_num_batched_tokens=1),
    )
    for params in variants:
        decision = make("token_load", **params).pick(req, replicas, 0.0)
        assert decision.scores == {
            "p0": pytest.approx((30_000 + 800) / 10_000),
            "p1": pytest.approx((1_000 + 3200) / 10_000),
        }
        assert decision.chosen == "p1"


def test_token_load_ties_prefer_overlap() -> None:
    replicas = [rep("a", prefill_tokens_queued=1600), rep("b", overlap_blocks=100)]
    # Both finish at 0.16 s; b keeps the prefix warm.
    assert make("token_load").pick(request(1600), replicas, 0.0).chosen == "b"


def test_token_load_decode_headroom() -> None:
    req = request(1600, max_tokens=10_000)  # need = ceil((1600 + 256) / 16) = 116 blocks
    replicas = [
        rep("full", kv_capacity_blocks=1000, decode_blocks=900),  # headroom 100 < 116
        rep("busy", kv_capacity_blocks=1000, decode_blocks=500, prefill_tokens_queued=1600),
        rep("idle", kv_capacity_blocks=1000, kv_usage=0.3),  # used = ceil(0.3 * 1000) = 300
    ]
    decision = make("token_load_decode").pick(req, replicas, 0.0)
    assert "full" in decision.rejected and "116" in decision.rejected["full"]
    assert decision.scores["busy"] == pytest.approx((500 + 100 + 116) / 1000)
    assert decision.scores["idle"] == pytest.approx((300 + 116) / 1000)
    assert decision.chosen == "idle"

    # Everyone is full: the least loaded is still chosen, and the reason says so.
    crowded = [
        rep("x", kv_capacity_blocks=100, decode_blocks=90),
        rep("y", kv_capacity_blocks=100, decode_blocks=95),
    ]
    decision = make("token_load_decode").pick(req, crowded, 0.0)
    assert decision.chosen == "x"
    assert "no replica has KV headroom" in decision.reason

    # A margin keeps part of the pool free.
    margin = make("token_load_decode", kv_headroom_margin=0.5)
    half = [
        rep("p", kv_capacity_blocks=1000, decode_blocks=300),  # 500 - 300 = 200 >= 116
        rep("q", kv_capacity_blocks=2000, decode_blocks=950),
    ]  # 1000 - 950 = 50 < 116
    decision = margin.pick(req, half, 0.0)
    assert decision.rejected.keys() == {"q"} and decision.chosen == "p"

    # Unknown capacity: compare in blocks, reject nobody.
    unknown = [rep("u", decode_blocks=10), rep("v", decode_blocks=5)]
    decision = make("token_load_decode").pick(request(160, max_tokens=16), unknown, 0.0)
    assert decision.chosen == "v" and not decision.rejected
    assert decision.scores["v"] == 5 + 11  # ceil((160 + 16) / 16)
