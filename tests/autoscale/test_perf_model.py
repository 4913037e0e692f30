"""The performance models: the queueing and batch rules, the sweep interpolation, the online fit."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from autoscale.perf_model import (
    OnlinePerfModel,
    SweepPerfModel,
    TimingPerfModel,
    build_perf_model,
    max_utilisation,
    ttft_at_percentile,
)
from autoscale.perf_sweep import Sweep, timing_sweep
from autoscale.policy import load_policy
from autoscale.signals import LatencySummary, Observation, Pool, ReplicaSignals
from pools.sim.timing import make_timing


@pytest.fixture(scope="module")
def timing_model() -> TimingPerfModel:
    return TimingPerfModel(make_timing("llama-3.1-8b", "h100"))


def test_ttft_percentile_closed_form() -> None:
    # below rho = 1 - q the q-quantile of the wait is 0; above it the exponential tail
    assert ttft_at_percentile(0.1, 0.005, 0.99) == 0.1
    expected = 0.1 + 0.1 / (2 * 0.5) * math.log(0.5 / 0.01)
    assert ttft_at_percentile(0.1, 0.5, 0.99) == pytest.approx(expected)
    assert ttft_at_percentile(0.1, 1.0, 0.99) == math.inf


@pytest.mark.parametrize("service_s", [0.05, 0.5, 1.5])
def test_max_utilisation_is_the_largest_rho_meeting_the_target(service_s: float) -> None:
    rho = max_utilisation(service_s, 2.0, 0.99, rho_max=0.95)
    assert 0 < rho <= 0.95
    assert ttft_at_percentile(service_s, rho, 0.99) <= 2.0 + 1e-9
    if rho < 0.95:
        assert ttft_at_percentile(service_s, rho + 1e-6, 0.99) > 2.0


def test_max_utilisation_zero_when_service_alone_misses() -> None:
    assert max_utilisation(2.5, 2.0, 0.99) == 0.0


def test_prefill_capacity_from_the_timing_model(timing_model: TimingPerfModel) -> None:
    t = timing_model.timing
    assert timing_model.prefill_time_s(4096) == t.prefill_time(4096)
    rho = timing_model.prefill_utilisation(4096, 2.0)
    assert timing_model.prefill_tokens_per_s(4096, 2.0) == pytest.approx(
        rho * 4096 / t.prefill_time(4096)
    )
    # short prompts hit the rho_max cap; long ones are bound by the TTFT tail
    assert timing_model.prefill_utilisation(512, 2.0) == 0.9
    assert timing_model.prefill_utilisation(16384, 2.0) < 0.9
    # a looser target never lowers capacity; an unreachable one gives 0
    assert timing_model.prefill_tokens_per_s(16384, 5.0) > timing_model.prefill_tokens_per_s(
        16384, 2.0
    )
    assert timing_model.prefill_tokens_per_s(32768, 1.0) == 0.0


def test_estimated_ttft_adds_the_queue_ahead(timing_model: TimingPerfModel) -> None:
    alone = timing_model.prefill_time_s(2048) + timing_model.transfer_s(2048)
    assert timing_model.estimated_ttft_s(2048) == pytest.approx(alone)
    # four 1024-token prompts ahead: four 1024-token prefills first
    queued = timing_model.estimated_ttft_s(2048, 4096, mean_queued_isl_tokens=1024)
    assert queued == pytest.approx(alone + 4 * timing_model.prefill_time_s(1024))


def test_decode_batch_is_the_largest_within_the_itl_target(timing_model: TimingPerfModel) -> None:
    target = 0.008
    b = timing_model.decode_max_batch(2048, target)
    assert 1 <= b < timing_model.kv_max_batch(2048)
    assert timing_model.decode_step_s(b, 2048) <= target < timing_model.decode_step_s(b + 1, 2048)
    assert timing_model.decode_tokens_per_s(2048, target) == pytest.approx(
        b / timing_model.decode_step_s(b, 2048)
    )
    assert timing_model.decode_max_batch(2048, 0.001) == 0


def test_decode_batch_is_capped_by_kv_and_max_num_seqs() -> None:
    model = TimingPerfModel(make_timing("llama-3.1-8b", "h100", kv_memory_gb=4.0))
    capacity_blocks = model.kv_capacity_tokens // 16 - 1
    assert model.decode_max_batch(4096, 1.0) == capacity_blocks // 256 == model.kv_max_batch(4096)
    small = TimingPerfModel(make_timing("llama-3.1-8b", "h100", max_num_seqs=32))
    assert small.decode_max_batch(128, 1.0) == 32


def test_sweep_file_round_trip_and_interpolation(tmp_path: Path) -> None:
    timing = make_timing("llama-3.1-8b", "h100")
    sweep = timing_sweep(timing, model_profile="llama-3.1-8b", gpu="h100")
    sweep.save(tmp_path / "s.json")
    model = SweepPerfModel.load(tmp_path / "s.json")
    exact = TimingPerfModel(timing, include_transfer=False)
    for n in sweep.prefill:  # the points themselves
        assert model.prefill_time_s(n) == pytest.approx(timing.prefill_time(n))
    for n in (300, 3000, 12000, 24000):  # between points: piecewise-linear, within 15 %
        assert model.prefill_time_s(n) == pytest.approx(exact.prefill_time_s(n), rel=0.15)
    # decode: linear in batch at fixed context and in context at fixed batch, so exact
    for b, c in [(1, 512), (100, 1000), (200, 2048), (300, 4000), (50, 8192)]:
        assert model.decode_step_s(b, c) == pytest.approx(exact.decode_step_s(b, c), rel=1e-6)
    for c in (512, 2048, 8192):
        assert model.decode_max_batch(c, 0.008) == exact.decode_max_batch(c, 0.008)
    assert model.kv_capacity_tokens == timing.kv_capacity_tokens


def test_bad_sweep_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match="not a sweep file"):
        Sweep.load(tmp_path / "x.json")


def test_online_correction_converges_and_forgets(timing_model: TimingPerfModel) -> None:
    online = OnlinePerfModel(timing_model, half_life_s=60.0)
    assert online.correction(Pool.DECODE) == 1.0
    for i in range(20):  # the real engine is 1.5x slower at decode
        b = 8 + i
        online.observe_decode(float(i), b, 2048, 1.5 * timing_model.decode_step_s(b, 2048))
    assert online.correction(Pool.DECODE) == pytest.approx(1.5)
    assert online.correction(Pool.PREFILL) == 1.0
    assert online.decode_step_s(16, 2048) == pytest.approx(
        1.5 * timing_model.decode_step_s(16, 2048)
    )
    assert online.decode_max_batch(2048, 0.02) < timing_model.decode_max_batch(2048, 0.02)
    # it gets faster: after 10 half-lives the old samples weigh ~0.1 %
    for i in range(20):
        b = 8 + i
        online.observe_decode(600.0 + i, b, 2048, 0.8 * timing_model.decode_step_s(b, 2048))
    assert online.correction(Pool.DECODE) == pytest.approx(0.8, rel=0.01)


def test_online_correction_is_clamped(timing_model: TimingPerfModel) -> None:
    online = OnlinePerfModel(timing_model, min_correction=0.5, max_correction=2.0)
    online.observe_prefill(0.0, 2048, 100.0)
    assert online.correction(Pool.PREFILL) == 2.0


def test_online_fit_from_observations(timing_model: TimingPerfModel) -> None:
    online = OnlinePerfModel(timing_model)
    truth = timing_model.prefill_time_s(1500) + timing_model.transfer_s(1500)
    obs = Observation(
        now=10.0,
        window_s=5.0,
        pools={},
        num_requests=40,
        mean_isl_tokens=2000.0,
        prefix_hit_rate=0.25,
        ttft=LatencySummary(count=40, p50_s=2.0 * truth),
        replicas=(
            ReplicaSignals("p0", Pool.PREFILL, num_waiting=0),
            ReplicaSignals(
                "d0", Pool.DECODE, num_running=64, decode_kv_tokens=64 * 1024,
                mean_step_s=3.0 * timing_model.decode_step_s(64, 1024),
            ),
        ),
    )  # fmt: skip
    online.observe(obs)
    assert online.correction(Pool.PREFILL) == pytest.approx(2.0)
    assert online.correction(Pool.DECODE) == pytest.approx(3.0)
    # a queued prefill replica makes TTFT include waiting: not a service-time sample
    queued = OnlinePerfModel(timing_model)
    replicas = (ReplicaSignals("p0", Pool.PREFILL, num_waiting=3),)
    queued.observe(_with(obs, replicas))
    assert queued.samples(Pool.PREFILL) == 0


def test_online_fit_skips_a_median_ttft_beyond_the_correction_bound(
    timing_model: TimingPerfModel,
) -> None:
    # idle queues at the read, but a median 5x the prior's service time (max_correction 4):
    # a backlog drained within the window, not a slower engine; 4x is still learnt
    truth = timing_model.prefill_time_s(1000) + timing_model.transfer_s(1000)
    for factor, samples in ((5.0, 0), (4.0, 1)):
        online = OnlinePerfModel(timing_model, max_correction=4.0)
        obs = Observation(
            now=10.0,
            window_s=5.0,
            pools={},
            num_requests=40,
            mean_isl_tokens=1000.0,
            ttft=LatencySummary(count=40, p50_s=factor * truth),
            replicas=(ReplicaSignals("p0", Pool.PREFILL, num_waiting=0),),
        )
        online.observe(obs)
        assert online.samples(Pool.PREFILL) == samples


def _with(obs: Observation, replicas: tuple[ReplicaSignals, ...]) -> Observation:
    return Observation(
        now=obs.now,
        window_s=obs.window_s,
        pools=obs.pools,
        num_requests=obs.num_requests,
        mean_isl_tokens=obs.mean_isl_tokens,
        prefix_hit_rate=obs.prefix_hit_rate,
        ttft=obs.ttft,
        replicas=replicas,
    )


def test_build_perf_model_per_source(tmp_path: Path) -> None:
    assert isinstance(
        build_perf_model(load_policy("perf_model: {source: timing-model}")), TimingPerfModel
    )
    online = build_perf_model(load_policy(""))
    assert isinstance(online, OnlinePerfModel) and isinstance(online.prior, TimingPerfModel)
    sweep = timing_sweep(
        make_timing("llama-3.1-8b", "h100"), model_profile="llama-3.1-8b", gpu="h100"
    )
    sweep.save(tmp_path / "sweep.json")
    (tmp_path / "p.yaml").write_text(
        "slo: {ttft_ms: {percentile: 90, target: 1000}}\n"
        "perf_model: {source: sweep, sweep_file: sweep.json, rho_max: 0.8}\n"
    )
    model = build_perf_model(load_policy(tmp_path / "p.yaml"))
    assert isinstance(model, SweepPerfModel)
    assert (model.percentile, model.rho_max) == (90.0, 0.8)
