"""The decode model's correction and KV cap, against hand-computed counts (Round 7).

LinearPerfModel numbers: decode step `10 ms + 0.4 ms·b`, so `b ≤ (ITL - 0.01) / 0.0004` (100 at
50 ms); `kv_tokens = 35,200` holds `35,200 // 1,100 = 32` sequences of `ISL + OSL/2 = 1,000 +
100` tokens. The load: 10 rps, OSL 200, own prefill 0.1 s, so Little's law at the target gives
`S = 10 · (0.1 + 200 · 0.05) = 101` sequences in flight.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from autoscale.baselines.oracle_decode import decode_in_flight_quantile
from autoscale.forecast_seam import EwmaForecaster
from autoscale.perf_model import OnlinePerfModel, TimingPerfModel
from autoscale.planner_terms import (
    fits,
    prefill_correction,
    reactive_term,
    ttft_breach_is_decode,
)
from autoscale.signals import Observation, Pool, ReplicaSignals
from autoscale.sizing import burst_quantile, decode_burst, decode_need
from pools.sim.timing import make_timing
from tests.autoscale.obs import latency, observation, pinned_planner, policy, replicas
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
    pl = pinned_planner(
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
    react = reactive_term(
        KV_32, policy(), obs, D, 0.5, min_samples=20, kv_high=0.9, decode_on_target=True
    )
    assert react.inputs["batch_at_target"] == 32.0
    assert react.replicas == 3  # ceil(80 / 32)
    off = reactive_term(KV_32, policy(), obs, D, 0.5, min_samples=20, kv_high=0.9)
    assert off.replicas == 2  # the default: 80 / (32 / 0.5)
    args = (KV_32, policy(), obs, D)
    for n, fit in ((2, False), (3, True)):
        on = fits(*args, n, 0.5, margin=0.8, min_samples=20, kv_high=0.9, decode_on_target=True)
        assert on is fit


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
    pl = pinned_planner(
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
    off = pinned_planner(
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


# -- the burst queue (perf_model.decode_burst_queue; autoscale/sizing.py, Round 9) -------------
# KV_32 packs B = 32 sequences a replica, its step D(32) = 10 + 0.4·32 = 22.8 ms, so the
# residence is 0.1 + 200 · 0.0228 = 4.66 s and the mean in flight m = 10 · 4.66 = 46.6.
Z99 = 2.3263478740408408  # Phi^-1(0.99)


def test_the_burst_quantile_is_the_mean_plus_z_sqrt_dispersion_mean() -> None:
    assert burst_quantile(100.0, 4.0, 0.99) == pytest.approx(100 + Z99 * 20)
    assert burst_quantile(100.0, 1.0, 0.5) == pytest.approx(100.0)  # z = 0 at the median
    assert burst_quantile(100.0, 0.2, 0.99) == pytest.approx(100 + Z99 * 10)  # I >= 1 (Poisson)
    assert burst_quantile(0.0, 16.0, 0.99) == 0.0


def _burst_need(dispersion: float | None, residence_at_step: bool = False) -> float:
    return decode_need(
        KV_32, 10.0, 1000.0, 200.0, 0.05, ttft_term_s=0.1, burst_dispersion=dispersion,
        residence_at_step=residence_at_step,
    )  # fmt: skip


def test_the_burst_queue_sizes_the_quantile_in_flight_on_the_packed_batch_residence() -> None:
    assert _burst_need(None) == pytest.approx(101 / 32)  # Little's law at the 50 ms target
    assert _burst_need(None, residence_at_step=True) == pytest.approx(46.6 / 32)
    # Poisson (I = 1): 46.6 + 2.326·sqrt(46.6) = 62.48 sequences -> 1.95 replicas
    assert _burst_need(1.0) == pytest.approx((46.6 + Z99 * math.sqrt(46.6)) / 32)
    # clustered (I = 16): 46.6 + 2.326·sqrt(745.6) = 110.12 -> 3.44, between the two
    assert _burst_need(16.0) == pytest.approx((46.6 + Z99 * math.sqrt(16 * 46.6)) / 32)
    assert 46.6 / 32 < _burst_need(16.0) < 101 / 32 + 0.5


def test_the_policy_switches_the_burst_queue_for_every_window_sizing() -> None:
    from autoscale.load_window import LoadWindow
    from autoscale.sizing import size_window

    w = LoadWindow(0.0, 60.0, 10.0, 1000.0, 200.0, 0.0)
    assert decode_burst(policy()) == (None, 0.99)
    on = policy(perf_model={"decode_burst_queue": True, "decode_burst_dispersion": 4.0})
    assert decode_burst(on) == (4.0, 0.99)
    # own prefill 1000 / 10,000 tok/s = 0.1 s: the numbers above with I = 4 -> 46.6 + 31.76
    assert size_window(KV_32, on, w)[D] == math.ceil((46.6 + Z99 * math.sqrt(4 * 46.6)) / 32)
    assert size_window(KV_32, policy(), w)[D] == 4  # ceil(101 / 32)
    with pytest.raises(ValueError, match="decode_burst_dispersion"):
        policy(perf_model={"decode_burst_dispersion": 0.5})


def test_the_oracle_counts_the_sequences_in_flight_at_each_decode_entry() -> None:
    # entries at a + 0.5 s, residence 10 tokens x 0.1 s: three at 0.5 s (exits 1.5 s), one at
    # 1.5 s (the three have left): counts 1, 2, 3, 1
    jobs = [(0.0, 0.5, 10), (0.0, 0.5, 10), (0.0, 0.5, 10), (1.0, 0.5, 10)]
    arrivals = [j[0] for j in jobs]
    assert decode_in_flight_quantile(jobs, arrivals, 0.0, 2.0, 0.1, 0.99, 10.0) == 3.0
    assert decode_in_flight_quantile(jobs, arrivals, 0.0, 2.0, 0.1, 0.5, 10.0) == 1.0
    # no arrival in [1.6, 3): the one still decoding (exit 2.5 s) is counted in flight
    assert decode_in_flight_quantile(jobs, arrivals, 1.6, 3.0, 0.1, 0.99, 10.0) == 1.0
    # [1.0, 2.0): only the 1.0 s arrival is counted at its entry, but the three that
    # arrived before are in flight at 1.0 s
    assert decode_in_flight_quantile(jobs, arrivals, 1.0, 2.0, 0.1, 0.99, 10.0) == 3.0


def test_the_oracle_with_the_burst_queue_sizes_a_spike_the_window_mean_hides() -> None:
    # 64 requests within 64 ms: 1.07 rps over the 60 s window (the closed form asks 1
    # replica even with I = 16), but all 64 decode at once: ceil(64 / 32) = 2
    from autoscale.baselines.oracle import OraclePlanner

    reqs = [(i * 0.001, 1000, 200, 0.0) for i in range(64)]
    on = policy(perf_model={"decode_burst_queue": True})
    assert OraclePlanner(on, KV_32, requests=reqs).need(0.0, 30.0)[D] == 2
    assert OraclePlanner(policy(), KV_32, requests=reqs).need(0.0, 30.0)[D] == 1


# -- Round 10: a TTFT breach while sequences wait for a decode slot is decode's ------------
# LinearPerfModel: 1000-token prompts prefill in 0.1 s at 10k tok/s (mu); 10 rps = 10k tok/s
# of prompts = 1.0 prefill replica steady; decode batch at the 50 ms target 100 per replica.


def _waiting_obs(queued_per_prefill: int, waiting: int = 5) -> Observation:
    reps = (
        *replicas(Pool.PREFILL, 2, queued_prefill_tokens=queued_per_prefill),
        ReplicaSignals("decode-0", D, num_running=90, num_waiting=waiting),
    )
    return observation(rate=10.0, p=(2, 0), d=(1, 0), ttft=latency(3.0), reps=reps)


def _react(obs: Observation, pool: Pool, decode_wait: bool) -> Any:
    perf = LinearPerfModel()
    return reactive_term(
        perf, policy(), obs, pool, 1.0, min_samples=20, kv_high=0.9, decode_wait=decode_wait
    )


def test_a_ttft_breach_with_decode_waiting_grows_decode_not_prefill() -> None:
    # prefill's own wait: 0.1 s + (2,000 tokens / 10k tok/s) = 0.3 s <= 2 s: decode's breach
    obs = _waiting_obs(2000)
    assert obs.decode_waiting() == 5
    assert ttft_breach_is_decode(LinearPerfModel(), policy(), obs, 1.0)
    # without the attribution: prefill +1 over its 2 provisioned; decode ceil(0.9 + 0.05) = 1
    assert _react(obs, Pool.PREFILL, False).replicas == 3
    assert _react(obs, D, False).replicas == 1
    # with it: prefill its steady need, ceil(10k / 10k) = 1 (no backlog: 2 x 10k - 10k > 0);
    # decode +1 over its 1 provisioned
    pre = _react(obs, Pool.PREFILL, True)
    assert pre.replicas == 1 and pre.inputs["breach_from"] == "decode"
    dec = _react(obs, D, True)
    assert dec.replicas == 2 and dec.reason == "ttft-decode-wait"


def test_a_ttft_breach_stays_prefills_when_its_own_queue_misses_the_target() -> None:
    # 30,000 queued per prefill replica: 0.1 + 3.0 s > 2 s: prefill +1 as before (decode also
    # grows: its waiting sequences delay first tokens whoever else does)
    obs = _waiting_obs(30_000)
    assert not ttft_breach_is_decode(LinearPerfModel(), policy(), obs, 1.0)
    assert _react(obs, Pool.PREFILL, True).replicas == 3
    assert _react(obs, D, True).replicas == 2
    # no sequence waiting: nothing is decode's
    idle = _waiting_obs(2000, waiting=0)
    assert not ttft_breach_is_decode(LinearPerfModel(), policy(), idle, 1.0)
    assert _react(idle, D, True).replicas == 1


def test_no_prefill_correction_from_a_window_with_decode_waiting() -> None:
    # observed mean 0.3 s over the M/D/1 0.1 * (1 + 0.5 / (2 * 0.5)) = 0.15 s (rho 0.5): k 2.0
    reps = (ReplicaSignals("decode-0", D, num_running=90, num_waiting=5),)
    obs = observation(rate=10.0, p=(2, 0), d=(1, 0), ttft=latency(0.3), reps=reps)
    assert prefill_correction(LinearPerfModel(), obs, 20) == pytest.approx(2.0)
    assert prefill_correction(LinearPerfModel(), obs, 20, decode_wait=True) is None


def test_the_online_fit_learns_no_prefill_from_a_window_with_decode_waiting() -> None:
    timing = make_timing("llama-3.1-8b", "h100")
    reps = (ReplicaSignals("decode-0", D, num_running=90, num_waiting=5),)
    obs = observation(rate=10.0, p=(2, 0), d=(1, 0), ttft=latency(0.05), reps=reps)
    learns = OnlinePerfModel(TimingPerfModel(timing))
    learns.observe(obs)
    assert learns.samples(Pool.PREFILL) == 1
    skips = OnlinePerfModel(TimingPerfModel(timing), skip_decode_wait=True)
    skips.observe(obs)
    assert skips.samples(Pool.PREFILL) == 0
    calm = observation(rate=10.0, p=(2, 0), d=(1, 0), ttft=latency(0.05))
    skips.observe(calm)
    assert skips.samples(Pool.PREFILL) == 1
