"""The online prefill fit on the prefill leg (`perf_model.online_prefill_signal: prefill-leg`):
the closed form, the guards, and the fit read off a simulated fleet whose engine timing is
known (the prior exact, and a prior 2x too fast), beside what the end-to-end TTFT fit reads."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autoscale.metrics_sources.engines import EngineWindow, engines_observation
from autoscale.metrics_sources.histogram import CumulativeHistogram
from autoscale.perf_model import (
    OnlinePerfModel,
    TimingPerfModel,
    build_perf_model,
    leg_correction,
    mean_response_s,
)
from autoscale.planner_terms import prefill_correction
from autoscale.policy import PolicyError, PrefillSignal, load_policy
from autoscale.signals import LatencySummary, Observation, Pool, PoolStatus, ReplicaSignals
from benchmarks.autoscale_sim.observe import ObservationBuilder
from benchmarks.fleet_sim import FleetSpec, SimConfig
from benchmarks.fleet_sim.membership import DynamicFleetSimulator
from pools.sim.profiles import get_gpu, get_model
from pools.sim.timing import TimingModel, make_timing
from tests.autoscale.perf_double import LinearPerfModel
from tests.benchmarks.test_autoscale_sim import phases

LEG = PrefillSignal.PREFILL_LEG


@pytest.fixture(scope="module")
def h100() -> TimingPerfModel:
    return TimingPerfModel(make_timing("llama-3.1-8b", "h100"))


def test_leg_correction_inverts_the_md1_mean() -> None:
    # L = kS(1 + k rho0 / (2(1 - k rho0))): at k = 1.6, S = 40 ms, rho0 = 0.3 (rho 0.48)
    s, rho0 = 0.04, 0.3
    leg = mean_response_s(1.6 * s, 1.6 * rho0)
    assert leg == pytest.approx(1.6 * s * (1 + 0.48 / (2 * 0.52)))
    assert leg_correction(leg, s, rho0, 0.25, 4.0, 0.9) == pytest.approx(1.6, rel=1e-9)
    # an idle replica: the leg is the service time itself
    assert leg_correction(0.05, s, 0.0, 0.25, 4.0, 0.9) == pytest.approx(1.25, rel=1e-9)


def test_leg_correction_refuses_what_service_cannot_explain() -> None:
    s = 0.04
    # more than max_correction x the service at an idle replica: a drained backlog
    assert leg_correction(5.0 * s, s, 0.0, 0.25, 4.0, 0.9) is None
    # at rho0 = 0.5 a k above 1.8 would mean rho above rho_max 0.9: a queue, not service
    assert leg_correction(mean_response_s(1.9 * s, 0.95), s, 0.5, 0.25, 4.0, 0.9) is None
    assert leg_correction(mean_response_s(1.7 * s, 0.85), s, 0.5, 0.25, 4.0, 0.9) is not None
    # faster than min_correction allows, or nothing to compare
    assert leg_correction(0.1 * s, s, 0.0, 0.25, 4.0, 0.9) is None
    assert leg_correction(0.0, s, 0.0, 0.25, 4.0, 0.9) is None
    assert leg_correction(math.inf, s, 0.0, 0.25, 4.0, 0.9) is None


def _obs(
    leg_mean_s: float, *, legs: int = 40, waiting: int = 0, ttft_s: float = 1.0
) -> Observation:
    return Observation(
        now=10.0,
        window_s=5.0,
        pools={Pool.PREFILL: PoolStatus(ready=2), Pool.DECODE: PoolStatus(ready=2)},
        num_requests=legs,
        arrival_rps=legs / 5.0,
        mean_isl_tokens=2000.0,
        prefix_hit_rate=0.5,
        ttft=LatencySummary(count=legs, p50_s=ttft_s, mean_s=ttft_s),
        prefill_leg=LatencySummary(count=legs, p50_s=leg_mean_s, mean_s=leg_mean_s),
        prefill_leg_uncached_tokens=1000.0,
        replicas=(
            ReplicaSignals("p0", Pool.PREFILL, num_waiting=waiting),
            ReplicaSignals("p1", Pool.PREFILL),
        ),
    )


def test_online_fit_on_the_leg_learns_the_service_not_the_ttft(h100: TimingPerfModel) -> None:
    s = h100.prefill_time_s(1000)
    rho0 = 40 / 5.0 * s / 2  # 8 legs/s over 2 ready replicas
    leg = mean_response_s(1.5 * s, 1.5 * rho0)
    online = OnlinePerfModel(h100, prefill_signal=LEG)
    online.observe(_obs(leg, ttft_s=3 * s))  # the TTFT (3x S) is not read
    assert online.correction(Pool.PREFILL) == pytest.approx(1.5, rel=1e-6)
    # the TTFT signal reads the same window as 3 S / (S(1000) + transfer(1000)) of the
    # arrivals' uncached ISL (2000 x 0.5)
    ttft = OnlinePerfModel(h100)
    ttft.observe(_obs(leg, ttft_s=3 * s))
    assert ttft.correction(Pool.PREFILL) == pytest.approx(3 * s / (s + h100.transfer_s(1000)))
    # a queue at the read, or a window without legs: no sample
    for obs in (_obs(leg, waiting=2), dataclasses.replace(_obs(leg), prefill_leg=LatencySummary())):
        none = OnlinePerfModel(h100, prefill_signal=LEG)
        none.observe(obs)
        assert none.samples(Pool.PREFILL) == 0


def test_planner_prefill_correction_on_the_leg() -> None:
    perf = LinearPerfModel()
    obs = _obs(0.5)
    t_own = perf.prefill_time_s(1000)
    rho = 40 / 5.0 * t_own / 2
    expected = 0.5 / (t_own * (1 + rho / (2 * (1 - rho))))
    assert prefill_correction(perf, obs, 20, leg=True) == pytest.approx(expected)
    assert prefill_correction(perf, obs, 41, leg=True) is None  # 40 legs < min_samples
    no_legs = dataclasses.replace(obs, prefill_leg=LatencySummary())
    assert prefill_correction(perf, no_legs, 20, leg=True) is None
    assert prefill_correction(perf, no_legs, 20) is not None  # the TTFT reading is unchanged


def test_policy_option_reaches_the_model_and_names_the_field_when_bad() -> None:
    online = build_perf_model(load_policy("perf_model: {online_prefill_signal: prefill-leg}"))
    assert isinstance(online, OnlinePerfModel) and online.prefill_signal is LEG
    default = build_perf_model(load_policy(""))  # ttft: the leg flapped the whole Azure hour
    assert isinstance(default, OnlinePerfModel) and default.prefill_signal is PrefillSignal.TTFT
    with pytest.raises(PolicyError, match=r"perf_model\.online_prefill_signal"):
        load_policy("perf_model: {online_prefill_signal: median}")


def _fast_prefill_prior() -> TimingPerfModel:
    """The H100 model with twice the tensor FLOP/s: its prefill (compute-bound) ~2x faster than
    the simulated engine's, its decode (memory-bound) about the same."""
    gpu = get_gpu("h100")
    fast = dataclasses.replace(gpu, name="h100-2x-flops", peak_flops=2 * gpu.peak_flops)
    return TimingPerfModel(TimingModel(get_model("llama-3.1-8b"), fast))


def test_fit_on_a_simulated_fleet_reads_the_engines_true_prefill_speed(
    h100: TimingPerfModel,
) -> None:
    # 1P + 2D H100 engines, ~1.5k-token prompts at 16 rps (prefill rho ~0.65): the exact
    # prior must read ~1, the 2x-too-fast prior the true ratio of the engine's prefill to its
    # own (measured: 1.03 and 2.05 against 1.99; 4 and 8 rps: 1.08 / 2.15 and 1.05 / 2.08)
    slow_prior = _fast_prefill_prior()
    truth = h100.prefill_time_s(1500) / slow_prior.prefill_time_s(1500)
    assert 1.9 < truth < 2.1
    fits = {
        "exact-leg": OnlinePerfModel(h100, prefill_signal=LEG),
        "fast-leg": OnlinePerfModel(slow_prior, prefill_signal=LEG),
        "exact-ttft": OnlinePerfModel(h100),
    }
    state: list[ObservationBuilder] = []

    def ctl(sim: DynamicFleetSimulator, now: float) -> None:
        if not state:
            state.append(ObservationBuilder(sim, 2.0, 0.05))
        if now > 0 and now % 5.0 == 0:
            obs = state[0].observe(now)
            for fit in fits.values():
                fit.observe(obs)

    sim = DynamicFleetSimulator(
        phases([(800, 16.0, 1500, 50)]),
        SimConfig(FleetSpec.parse("1P2D")),
        controller=ctl,
        control_interval_s=0.5,
    )
    sim.run_dynamic()
    assert all(f.samples(Pool.PREFILL) >= 5 for f in fits.values())
    legs = [(r.arrival, r.prefill_end) for r in sim.all_records if r.prefill_end is not None]
    assert len(legs) == 800 and all(end >= arrival for arrival, end in legs)
    assert fits["exact-leg"].correction(Pool.PREFILL) == pytest.approx(1.0, abs=0.1)
    assert fits["fast-leg"].correction(Pool.PREFILL) == pytest.approx(truth, rel=0.1)
    # the end-to-end TTFT holds the transfer and the decode replica's first step(s): against
    # the same exact prior it reads the engine as 2x slower than it is (measured 2.08)
    assert fits["exact-ttft"].correction(Pool.PREFILL) > 1.5


def _window(pool: Pool, ttft: dict[float, float], ttft_sum: float, prompts: float) -> EngineWindow:
    empty = CumulativeHistogram()
    return EngineWindow(
        pool=pool,
        success=10.0,
        prefix_queries=1000.0 if pool is Pool.PREFILL else 0.0,
        prefix_hits=250.0 if pool is Pool.PREFILL else 0.0,
        ttft=CumulativeHistogram.from_buckets(ttft, ttft_sum),
        itl=empty,
        prompt=CumulativeHistogram.from_buckets({4096.0: 10.0}, prompts),
        generation=empty,
    )


def test_engine_scrape_reports_the_prefill_engines_ttft_as_the_leg() -> None:
    # live: a prefill engine's first token ends the prefill leg, so its TTFT histogram is the
    # leg; the decode engines' TTFT (transfer + first step) is not read
    windows = [
        _window(Pool.PREFILL, {0.05: 10.0}, 0.4, 16000.0),  # 10 legs, 40 ms mean, 1600 tok
        _window(Pool.DECODE, {1.0: 10.0}, 9.0, 16000.0),
    ]
    obs = engines_observation(10.0, 5.0, (), windows)
    assert obs.prefill_leg.count == 10 and obs.prefill_leg.mean_s == pytest.approx(0.04)
    assert obs.prefill_leg_uncached_tokens == pytest.approx(1600 * (1 - 0.25))
    assert engines_observation(10.0, 0.0, (), windows).prefill_leg.count == 0  # priming read
