"""The decode model's correction and KV cap, against hand-computed counts (Round 7).

LinearPerfModel numbers: decode step `10 ms + 0.4 ms·b`, so `b ≤ (ITL - 0.01) / 0.0004` (100 at
50 ms); `kv_tokens = 35,200` holds `35,200 // 1,100 = 32` sequences of `ISL + OSL/2 = 1,000 +
100` tokens. The load: 10 rps, OSL 200, own prefill 0.1 s, so Little's law at the target gives
`S = 10 · (0.1 + 200 · 0.05) = 101` sequences in flight.
"""

from __future__ import annotations

import pytest

from autoscale.forecast_seam import EwmaForecaster
from autoscale.perf_model import OnlinePerfModel, TimingPerfModel
from autoscale.planner import PdorchPlanner
from autoscale.planner_terms import fits, reactive_term
from autoscale.signals import Observation, Pool, ReplicaSignals
from autoscale.sizing import decode_need
from pools.sim.timing import make_timing
from tests.autoscale.obs import observation, policy, replicas
from tests.autoscale.perf_double import LinearPerfModel

D = Pool.DECODE
KV_32 = LinearPerfModel(kv_tokens=32 * 1100)


def _need(perf: LinearPerfModel, correction: float, on_target: bool = True) -> float:
    return decode_need(
        perf, 10.0, 1000.0, 200.0, 0.05, ttft_term_s=0.1, correction=correction,
        correction_on_target=on_target,
    )  # fmt: skip


def test_the_correction_moves_the_itl_target_and_the_kv_pool_still_caps_the_batch() -> None:
    # k = 1: min(100 by ITL, 32 by KV) = 32 -> 101 / 32
    assert _need(KV_32, 1.0) == pytest.approx(101 / 32)
    # k = 0.5 (the engine steps twice as fast as modelled): ITL / k = 0.1 s allows 225 by the
    # step, but the KV pool still holds 32: the same 101 / 32 (it was 101 / (32 / 0.5) = 1.58)
    assert _need(KV_32, 0.5) == pytest.approx(101 / 32)
    # k = 4: ITL / k = 12.5 ms allows floor(2.5 ms / 0.4 ms) = 6 sequences -> 101 / 6
    assert _need(KV_32, 4.0) == pytest.approx(101 / 6)
    # step-bound (no KV cap), k = 2: 25 ms allows floor(15 / 0.4) = 37 -> 101 / 37
    assert _need(LinearPerfModel(), 2.0) == pytest.approx(101 / 37)
    # the default (main's): the capped batch divided by k
    assert _need(KV_32, 0.5, on_target=False) == pytest.approx(101 / 64)
    assert _need(LinearPerfModel(), 2.0, on_target=False) == pytest.approx(101 / 50)


def test_the_floor_with_a_low_decode_correction_sizes_what_the_kv_pool_holds() -> None:
    # the Mooncake case: k_d at its 0.5 bound, KV-bound batch. ceil(101 / 32) = 4, where
    # dividing the capped batch by k counted 64 per replica: ceil(101 / 64) = 2
    pl = PdorchPlanner(
        policy(),
        KV_32,
        forecaster=EwmaForecaster(alpha=1.0),
        headroom=1.0,
        forecast_window_s=0.0,
        correction_alpha=0.0,  # keep the k set below
        decode_correction_on_target=True,
    )
    pl.correction[D] = 0.5
    d = pl.plan(observation(rate=10.0, p=(2, 0), d=(4, 0)))
    assert d.details["decode"]["floor"] == 4 and d.desired[D] == 4


def _decode_obs(running_per_replica: int, n: int = 2) -> Observation:
    reps = replicas(
        D, n, num_running=running_per_replica, decode_kv_tokens=running_per_replica * 1100
    )
    return observation(rate=0.0, d=(n, 0), reps=reps)


def test_reactive_and_fit_terms_count_the_kv_capped_batch_under_a_low_correction() -> None:
    obs = _decode_obs(40)  # 80 sequences of 1,100 tokens on 2 replicas, 32 fit in each
    on = {"min_samples": 20, "kv_high": 0.9, "decode_on_target": True}
    react = reactive_term(KV_32, policy(), obs, D, 0.5, **on)  # type: ignore[arg-type]
    assert react.inputs["batch_at_target"] == 32.0
    assert react.replicas == 3  # ceil(80 / 32)
    off = reactive_term(KV_32, policy(), obs, D, 0.5, min_samples=20, kv_high=0.9)
    assert off.replicas == 2  # the default: 80 / (32 / 0.5)
    args = (KV_32, policy(), obs, D)
    assert not fits(*args, 2, 0.5, margin=0.8, **on)  # type: ignore[arg-type]
    assert fits(*args, 3, 0.5, margin=0.8, **on)  # type: ignore[arg-type]


def test_online_decode_fit_skips_a_window_beyond_the_correction_bound() -> None:
    # a decode replica's mean step 5x the prior's (max_correction 4) is not a decode step: not
    # learnt; 4x still is
    timing = TimingPerfModel(make_timing("llama-3.1-8b", "h100"))
    step = timing.decode_step_s(8, 14_000)
    for skip, factor, samples in ((True, 5.0, 0), (True, 4.0, 1), (False, 5.0, 1)):
        online = OnlinePerfModel(timing, max_correction=4.0, skip_decode_outliers=skip)
        rep = ReplicaSignals(
            "d0", D, num_running=8, decode_kv_tokens=8 * 14_000, mean_step_s=factor * step
        )
        online.observe(observation(rate=0.0, reps=(rep,)))
        assert online.samples(D) == samples


def test_decode_floor_is_its_need_averaged_over_the_residence_time() -> None:
    # residence R = 0.1 s own prefill + 200 * 0.05 s = 10.1 s: the ticks of the last 10.1 s.
    # need(rate) = rate * 10.1 / 100 (step-bound batch 100): 10 rps -> 1.01, 30 rps -> 3.03
    pl = PdorchPlanner(
        policy(), LinearPerfModel(), forecaster=EwmaForecaster(alpha=1.0), headroom=1.0,
        forecast_window_s=0.0, decode_residence_mean=True,
    )  # fmt: skip
    floors = [
        pl.plan(observation(now, rate=rate, d=(4, 0))).details["decode"]["floor"]
        for now, rate in ((0.0, 10.0), (5.0, 30.0), (10.0, 30.0), (15.0, 30.0))
    ]
    # ceil(1.01), ceil((1.01 + 3.03) / 2 = 2.02), ceil(7.07 / 3 = 2.36), then t = 0 is 15 s old:
    # ceil(3.03)
    assert floors == [2, 3, 3, 4]
    off = PdorchPlanner(
        policy(), LinearPerfModel(), forecaster=EwmaForecaster(alpha=1.0), headroom=1.0,
        forecast_window_s=0.0, decode_residence_mean=False,
    )  # fmt: skip
    off.plan(observation(0.0, rate=10.0, d=(4, 0)))
    assert off.plan(observation(5.0, rate=30.0, d=(4, 0))).details["decode"]["floor"] == 4


def test_residence_mean_keeps_the_tick_itself_when_the_residence_is_shorter() -> None:
    from autoscale.residence import ResidenceMean

    r = ResidenceMean()
    assert r.add(0.0, 2.0, 12.0) == 2.0
    assert r.add(5.0, 4.0, 12.0) == 3.0
    assert r.add(10.0, 6.0, 1.0) == 6.0  # R shorter than a tick: this tick alone


def test_residence_at_the_capped_batchs_step_time() -> None:
    def need(perf: LinearPerfModel, at_step: bool) -> float:
        return decode_need(
            perf, 10.0, 1000.0, 200.0, 0.05, ttft_term_s=0.1, residence_at_step=at_step
        )

    # KV caps the batch at 32, whose step is 10 + 0.4 * 32 = 22.8 ms, not the 50 ms target:
    # S = 10 * (0.1 + 200 * 0.0228) = 46.6 sequences, so 46.6 / 32 replicas (101 / 32 at 50 ms)
    assert need(KV_32, False) == pytest.approx(101 / 32)
    assert need(KV_32, True) == pytest.approx(10 * (0.1 + 200 * 0.0228) / 32)
    # step-bound (no cap): the batch of 100 steps at exactly the target, nothing changes
    assert need(LinearPerfModel(), True) == pytest.approx(need(LinearPerfModel(), False))
