"""The burst decode's KV term (`autoscale/sizing.py`, "KV term"), hand-computed.

KV_32 (`tests/autoscale/perf_double.py`): step `10 ms + 0.4 ms·b`, KV 35,200 tokens, so 32
sequences of `ISL + OSL/2 = 1,000 + 100 = 1,100` tokens. The load: 10 rps, OSL 200, own
prefill 0.1 s, burst dispersion 16 at q = 0.99.
"""

from __future__ import annotations

import math

import pytest

from autoscale.sizing import context_tokens, decode_need, kv_replicas, kv_tokens_held
from tests.autoscale.perf_double import LinearPerfModel

KV_32 = LinearPerfModel(kv_tokens=32 * 1100)
Z99 = 2.3263478740408408  # Phi^-1(0.99)


class _NoKv(LinearPerfModel):
    def kv_usable_tokens(self) -> int | None:  # the base's "does not say"
        return None


def _sq(mean: float) -> float:
    return mean + Z99 * math.sqrt(16 * mean)


def _need(perf: LinearPerfModel, correction: float, headroom: float = 1.0) -> float:
    return decode_need(
        perf, 10.0, 1000.0, 200.0, 0.05, ttft_term_s=0.1, correction=correction,
        headroom=headroom, burst_dispersion=16.0,
    )  # fmt: skip


def test_a_sequence_holds_its_prompt_and_half_its_answer() -> None:
    assert kv_tokens_held(1000.0, 200.0) == 1100.0
    assert context_tokens(1000.0, 200.0) == 1100
    assert kv_replicas(KV_32, 35_200.0) == pytest.approx(1.0)
    assert kv_replicas(KV_32, 35_200.0, headroom=0.8) == pytest.approx(1.25)
    assert kv_replicas(_NoKv(), 35_200.0) is None


def test_at_correction_one_the_kv_term_is_the_count_over_the_kv_capped_batch() -> None:
    # B = 32 (KV cap), D(32) = 22.8 ms, m = 10·(0.1 + 200·0.0228) = 46.6: count S_q / 32, and
    # the KV side S_q·1,100 / 35,200 = S_q / 32, the same
    assert _need(KV_32, 1.0) == pytest.approx(_sq(46.6) / 32)
    assert _need(KV_32, 1.0) == pytest.approx(_need(_NoKv(kv_tokens=32 * 1100), 1.0))


def test_a_low_correction_does_not_pack_more_kv_than_the_pool_holds() -> None:
    # k = 0.5: the batch reads 32 / 0.5 = 64, its step 0.5·D(64) = 0.5·35.6 = 17.8 ms, so
    # m = 10·(0.1 + 200·0.0178) = 36.6; without the KV term S_q / 64
    m = 10 * (0.1 + 200 * 0.5 * (0.01 + 0.0004 * 64))
    assert _need(_NoKv(kv_tokens=32 * 1100), 0.5) == pytest.approx(_sq(m) / 64)
    # with it, the KV those sequences hold: S_q·1,100 / 35,200 = S_q / 32, twice that
    assert _need(KV_32, 0.5) == pytest.approx(_sq(m) / 32)
    # the headroom shrinks the KV side as it shrinks the batch: S_q·1,100 / (35,200·0.9)
    m9 = 10 * (0.1 + 200 * 0.5 * (0.01 + 0.0004 * math.ceil(64 * 0.9)))
    assert _need(KV_32, 0.5, headroom=0.9) == pytest.approx(_sq(m9) * 1100 / (35_200 * 0.9))


def test_where_max_num_seqs_binds_the_kv_term_does_not() -> None:
    # KV for 1,000 sequences of 1,100 tokens; the step caps the batch at 100: the count binds
    roomy = LinearPerfModel(kv_tokens=1000 * 1100)
    # B = 100, D(100) = 50 ms, m = 10·(0.1 + 200·0.05) = 101
    assert _need(roomy, 1.0) == pytest.approx(_sq(101.0) / 100)
