"""Each baseline's formula against hand-computed cases (LinearPerfModel numbers: prefill
8k tok/s per replica at target, 0.1 s for 1000 tokens; decode 100 seqs at 50 ms)."""

from __future__ import annotations

from typing import Any

import pytest

from autoscale.baselines.aibrix_kpa import AibrixKpaPlanner
from autoscale.baselines.dynamo_planner import DynamoPlanner
from autoscale.baselines.hpa_behavior import Behavior, HpaController, metric_recommendation
from autoscale.baselines.hpa_kv_util import HpaKvUtilPlanner
from autoscale.baselines.llmd_slo import LlmdSloPlanner, llmd_replicas
from autoscale.baselines.oracle import OraclePlanner, prefill_queue_replicas
from autoscale.baselines.static import StaticPlanner
from autoscale.forecast_seam import EwmaForecaster
from autoscale.load_window import LoadWindow
from autoscale.planners import planner_factory, planner_names
from autoscale.signals import LatencySummary, Pool, ReplicaSignals
from tests.autoscale.obs import latency, observation, policy, replicas
from tests.autoscale.perf_double import LinearPerfModel

P, D = Pool.PREFILL, Pool.DECODE
PERF = LinearPerfModel()


# -- HPA arithmetic -------------------------------------------------------------------------
def test_hpa_metric_recommendation() -> None:
    assert metric_recommendation([0.9, 0.9], 0, 0.7, 2) == 3  # ceil(2 * 0.9/0.7 = 2.57)
    assert metric_recommendation([0.75, 0.75], 0, 0.7, 2) == 2  # 1.07: within tolerance
    assert metric_recommendation([0.35, 0.35], 0, 0.7, 2) == 1  # ceil(2 * 0.5)
    # a pending pod counts as 0 when scaling up: (2 + 0) / 3 / 0.5 = 1.33 -> ceil(4.0) = 4
    assert metric_recommendation([1.0, 1.0], 1, 0.5, 3) == 4
    # ... and here it flips 2 * 0.9/0.7 = 1.29 to 1.8/3/0.7 = 0.86: no change
    assert metric_recommendation([0.9, 0.9], 1, 0.7, 3) == 3


def test_hpa_scale_down_takes_the_max_recommendation_of_300_s() -> None:
    hpa = HpaController(Behavior())
    assert hpa.decide(0.0, 4, 4) == (4, "hold")
    assert hpa.decide(100.0, 4, 2) == (4, "stabilization")
    assert hpa.decide(301.0, 4, 2) == (2, "metric")


def test_hpa_first_scale_down_is_held_by_the_seeded_current_count() -> None:
    # Kubernetes seeds the recommendation history with the current replicas: a first
    # recommendation of 1 does not drain an 8-replica pool on the first tick.
    hpa = HpaController(Behavior())
    assert hpa.decide(0.0, 8, 1) == (8, "stabilization")
    assert hpa.decide(200.0, 8, 1) == (8, "stabilization")
    assert hpa.decide(301.0, 8, 1) == (1, "metric")
    # Scaling up is not held by the seed (the up window is 0 s).
    assert HpaController(Behavior()).decide(0.0, 2, 3) == (3, "metric")


def test_hpa_scale_up_rate_max_of_100_percent_and_4_pods_per_15_s() -> None:
    hpa = HpaController(Behavior())
    assert hpa.decide(0.0, 2, 20) == (6, "rate-limit")  # max(2 + 2, 2 + 4)
    assert hpa.decide(5.0, 6, 20) == (6, "rate-limit")  # same period: started at 2
    assert hpa.decide(16.0, 6, 20) == (12, "rate-limit")  # new period: max(12, 10)


def test_hpa_kv_util_planner_per_pool_metrics_and_sync_period() -> None:
    pl = HpaKvUtilPlanner(policy(down_s=0.0), PERF)
    reps = replicas(D, 2, kv_usage=0.9) + replicas(P, 2, num_waiting=6)
    d = pl.plan(observation(0.0, p=(2, 0), d=(2, 0), reps=reps))
    assert d.desired == {P: 4, D: 3}  # waiting 6/3 -> ceil(2*2); kv 0.9/0.7 -> ceil(2.57)
    held = pl.plan(observation(5.0, p=(4, 0), d=(3, 0)))  # inside the 15 s sync period
    assert held.desired == {P: 4, D: 3}
    assert pl.interval_s == 15.0


# -- llm-d SLO recipe ---------------------------------------------------------------------
def test_llmd_formula_with_in_flight_credit() -> None:
    assert llmd_replicas(1.1, 4, 4) == 8  # 4 + ceil(4 * (1.1/0.55 - 1))
    assert llmd_replicas(1.1, 4, 2) == 4  # c = 0.5: 1.1 * 0.5 / 0.55 = 1 -> + 0
    assert llmd_replicas(0.2, 4, 4) == 2  # 4 - floor(4 * (1 - 0.5))
    assert llmd_replicas(0.5, 4, 4) == 4  # between 0.40 and 0.55: hold


def test_llmd_planner_maps_ttft_to_prefill_and_tpot_to_decode() -> None:
    obs = observation(p=(4, 0), d=(4, 0), ttft=latency(2.2), itl=latency(0.01))
    pl = LlmdSloPlanner(policy(), PERF)
    first = pl.plan(obs)
    # The history is seeded with the current 4 (Kubernetes): the 30 s up window holds the
    # first scale-up and the 180 s down window the first scale-down.
    assert first.desired == {P: 4, D: 4}
    d = pl.plan(observation(31.0, p=(4, 0), d=(4, 0), ttft=latency(2.2), itl=latency(0.01)))
    # prefill s = 1.1 -> 8 (up 100 %/4 pods allows 8); decode still held (180 s)
    assert d.desired == {P: 8, D: 4}
    later = observation(181.0, p=(8, 0), d=(4, 0), ttft=latency(0.8), itl=latency(0.01))
    d = pl.plan(later)
    # decode s averaged over 45 s = 0.2 -> 2, 1 pod/120 s -> 3
    assert d.desired[D] == 3
    assert d.reasons[D] == "rate-limit"
    both = LlmdSloPlanner(policy(), PERF, combined=True)
    both.plan(obs)
    assert both.plan(observation(31.0, p=(4, 0), d=(4, 0), ttft=latency(2.2))).desired == {
        P: 8,
        D: 8,
    }


def test_llmd_signal_is_capped_and_averaged_over_45_s() -> None:
    pl = LlmdSloPlanner(policy(), PERF)
    pl.plan(observation(0.0, ttft=latency(10.0)))  # 5 -> capped at 2
    pl.plan(observation(15.0, ttft=latency(0.6)))  # 0.3
    assert pl.signal(P) == pytest.approx(1.15)
    pl.plan(observation(50.0, ttft=latency(0.6), p=(8, 0)))  # the t=0 sample left the window
    assert pl.signal(P) == pytest.approx(0.3)
    pl.plan(observation(60.0, ttft=LatencySummary()))  # no data: no sample
    assert pl.signal(P) == pytest.approx(0.3)


# -- AIBrix KPA ------------------------------------------------------------------------------
def test_kpa_panics_at_twice_and_only_grows_in_panic() -> None:
    pl = AibrixKpaPlanner(policy(), PERF, scale_down_cooldown_s=0.0)  # Knative: no delay
    calm = pl.plan(observation(0.0, p=(1, 0), reps=replicas(P, 1, num_waiting=2)))
    assert calm.desired[P] == 1 and calm.reasons[P] == "stable"  # ceil(2 / 3)
    # panic mean (2 + 15) / 2 = 8.5 -> dppc 3, 3 / 1 >= 2: panic; clamped to ceil(2 * 1) = 2
    burst = pl.plan(observation(2.0, p=(1, 0), reps=replicas(P, 1, num_waiting=15)))
    assert burst.desired[P] == 2 and burst.reasons[P] == "panic"
    # the queue empties: 17 / 3 -> dppc 2, still >= 2 x 1: panic, and it never shrinks
    quiet = pl.plan(observation(4.0, p=(1, 1), reps=replicas(P, 1)))
    assert quiet.desired[P] == 2 and quiet.reasons[P] == "panic"
    # over 60 s after the last trigger, nothing waiting: stable, down by at most 2x
    late = pl.plan(observation(70.0, p=(2, 0), reps=replicas(P, 2)))
    assert late.desired[P] == 1 and late.reasons[P] == "stable"


def test_kpa_starts_in_panic_over_one_pod_and_can_delay_scale_down() -> None:
    pl = AibrixKpaPlanner(policy(), PERF)
    first = pl.plan(observation(0.0, p=(4, 0), reps=replicas(P, 4)))
    assert first.desired[P] == 4 and first.reasons[P] == "panic"  # keeps the scale
    delayed = AibrixKpaPlanner(policy(), PERF, scale_down_cooldown_s=30.0)
    delayed.plan(observation(0.0, p=(1, 0), reps=replicas(P, 1, num_waiting=6)))  # panic: 2
    d = delayed.plan(observation(70.0, p=(2, 0), reps=replicas(P, 2)))  # wants 1 at t = 70
    assert d.desired[P] == 1  # the t = 0 count left the 30 s window
    # t = 72: stable mean (0 + 18) / 2 = 9 -> 3 (9/3 / 2 pods < 2: no panic)
    assert (
        delayed.plan(observation(72.0, p=(2, 0), reps=replicas(P, 2, num_waiting=9))).desired[P]
        == 3
    )
    # t = 80: stable 18 / 3 -> 2, but 3 was asked for within the last 30 s
    d = delayed.plan(observation(80.0, p=(3, 0), reps=replicas(P, 3)))
    assert d.desired[P] == 3 and d.reasons[P] == "scale-down-cooldown"


def test_kpa_default_scale_down_cooldown_is_aibrix_300_s() -> None:
    # AIBrix's scale-down-cooldown-window default: the panic count 2 of t = 0 holds until the
    # t = 0 entry leaves the 300 s window, although stable mode wants 1 from t = 70 on
    pl = AibrixKpaPlanner(policy(), PERF)
    assert pl.plan(observation(0.0, p=(1, 0), reps=replicas(P, 1, num_waiting=6))).desired[P] == 2
    held = pl.plan(observation(70.0, p=(2, 0), reps=replicas(P, 2)))
    assert held.desired[P] == 2 and held.reasons[P] == "scale-down-cooldown"
    assert pl.plan(observation(299.0, p=(2, 0), reps=replicas(P, 2))).desired[P] == 2
    late = pl.plan(observation(301.0, p=(2, 0), reps=replicas(P, 2)))
    assert late.desired[P] == 1 and late.reasons[P] == "stable"


def test_kpa_tolerance_holds_the_count_within_10_percent() -> None:
    # 4 pods, 3 waiting per pod targeted: 13 waiting -> 13 / 12 = 1.08, within 1.1: hold 4
    # although ceil(13 / 3) = 5; 14 waiting -> 1.17: 5 (no panic: 5 / 4 < 2)
    for waiting, want, why in ((13, 4, "tolerance"), (14, 5, "stable")):
        pl = AibrixKpaPlanner(policy(), PERF, scale_down_cooldown_s=0.0)
        pl.plan(observation(0.0, p=(1, 0), reps=replicas(P, 1)))  # one pod: no initial panic
        reps = (*replicas(P, 3, num_waiting=3), *replicas(P, 1, num_waiting=waiting - 9))
        d = pl.plan(observation(70.0, p=(4, 0), reps=reps))
        assert (d.desired[P], d.reasons[P]) == (want, why)


def test_kpa_decode_uses_kv_usage() -> None:
    pl = AibrixKpaPlanner(policy(), PERF)
    d = pl.plan(observation(0.0, d=(3, 0), reps=replicas(D, 3, kv_usage=0.98)))
    assert d.desired[D] == 5  # ceil(2.94 / 0.7 = 4.2)


# -- Dynamo planner --------------------------------------------------------------------------
def dynamo(**options: object) -> DynamoPlanner:
    return DynamoPlanner(policy(), PERF, forecaster=EwmaForecaster(alpha=1.0), **options)  # type: ignore[arg-type]


def test_dynamo_throughput_mode_formulas() -> None:
    # N_p = ceil(16 rps * 1000 / 8000) = 2; N_d = ceil(16 * 200 / (100 / 0.05 s)) = 2
    d = dynamo(load_mode=False).plan(observation(rate=16.0, p=(1, 0), d=(1, 0)))
    assert d.desired == {P: 2, D: 2}
    # legacy: p_corr = 0.05 / 0.1 = 0.5 and min(1, p_corr) halves the prefill load: 1
    obs = observation(rate=16.0, ttft=latency(0.05))
    assert dynamo(load_mode=False).plan(obs).desired[P] == 2
    assert dynamo(load_mode=False, legacy_corrections=True).plan(obs).desired[P] == 1


def test_dynamo_legacy_decode_correction_factor() -> None:
    # 20 rps, OSL 200: 4000 tok/s over 2000 -> 2 without correction. With ITL 60 ms and TTFT
    # 0.1 s: conc = round(20 * 12.1 / 2) = 121, predicted step 58.4 ms, d_corr = 1.027,
    # ITL target 48.7 ms -> batch 96 -> 1983 tok/s -> ceil(2.02) = 3.
    plain = dynamo(load_mode=False).plan(observation(rate=20.0, d=(2, 0)))
    assert plain.desired[D] == 2
    obs = observation(rate=20.0, d=(2, 0), ttft=latency(0.1), itl=latency(0.06))
    assert dynamo(load_mode=False).plan(obs).desired[D] == 2
    assert dynamo(load_mode=False, legacy_corrections=True).plan(obs).desired[D] == 3


def test_dynamo_load_mode_up_when_every_engine_breaches() -> None:
    reps = replicas(P, 2, queued_prefill_tokens=30_000)  # est TTFT 3.1 s > 2 s on both
    d = dynamo().plan(observation(rate=0.1, p=(2, 0), reps=reps))
    assert d.desired[P] == 3 and d.reasons[P] == "load+1"


def test_dynamo_load_mode_down_only_when_consolidation_passes() -> None:
    # prefill, every engine: 1000 * 3/2 = 1500 queued -> 0.25 s - 0.1 s own < (2 - 0.1) * 0.8
    # decode: 20 seqs * 3/2 = 30 -> step 22 ms < 40 ms
    reps = replicas(P, 3, queued_prefill_tokens=1000) + replicas(D, 3, num_running=20)
    d = dynamo().plan(observation(rate=0.1, p=(3, 0), d=(3, 0), reps=reps))
    assert d.desired == {P: 2, D: 2}
    # decode at 60 seqs each: 90 * 0.4 ms + 10 ms = 46 ms > 40 ms: stays
    busy = replicas(D, 3, num_running=60)
    assert dynamo().plan(observation(rate=0.1, d=(3, 0), reps=busy)).desired[D] == 3
    # 12000 * 3/2 = 18000 -> 1.8 s induced >= 1.52 s: that engine vetoes the scale-down
    mixed = (
        *replicas(P, 2, queued_prefill_tokens=0),
        ReplicaSignals("p-long", P, queued_prefill_tokens=12000),
    )
    assert dynamo().plan(observation(rate=0.1, p=(3, 0), reps=mixed)).desired[P] == 3


def test_dynamo_skips_while_a_change_is_pending_and_shrinks_to_budget() -> None:
    pl = dynamo(load_mode=False)
    first = pl.plan(observation(0.0, rate=16.0))
    held = pl.plan(observation(5.0, rate=100.0, p=(1, 1)))
    assert held.desired == first.desired and held.reasons[P] == "pending-guard"
    # 32 rps: P wants 4, D wants 4 (6400 / 2000 = 3.2); budget 4 -> floor(4 * 0.5) = 2 each
    tight = DynamoPlanner(policy(budget=4), PERF, load_mode=False)
    assert tight.plan(observation(rate=32.0)).desired == {P: 2, D: 2}


# -- static and oracle -----------------------------------------------------------------------
def test_static_counts_from_options_or_trace() -> None:
    fixed = StaticPlanner(policy(), PERF, prefill=3, decode=5)
    assert fixed.plan(observation()).desired == {P: 3, D: 5}
    # OSL 100: decode S = rate * (0.1 + 5) -> 16 rps: 81.6 -> 1, 48 rps: 244.8 -> 3
    ws = [LoadWindow(0.0, 60.0, 16.0, 1000.0, 100.0), LoadWindow(60.0, 60.0, 48.0, 1000.0, 100.0)]
    assert StaticPlanner(policy(), PERF, windows=ws).plan(observation()).desired == {P: 6, D: 3}
    mean = StaticPlanner(policy(), PERF, mode="mean", windows=ws)  # 32 rps: 4 and 163.2 -> 2
    assert mean.plan(observation()).desired == {P: 4, D: 2}


def steady(rate: float, until: float, osl: int) -> list[tuple[float, int, int, float]]:
    return [(i / rate, 1000, osl, 0.0) for i in range(round(rate * until))]


def test_oracle_sizes_the_60_s_window_centred_on_the_interval() -> None:
    # The window-mean rule (`mean_need`: decode, the shared start fleet, and prefill when the
    # oracle has only `future=`). 16 rps all along plus 48 rps more in [40, 50). Interval
    # [30, 60): window [15, 75) holds 960 + 480 = 1440 requests = 24 rps -> 24k tok/s / 8k =
    # 3 prefill (the old rule sized the worst 10 s piece, 64 rps -> 8). Decode: S = 24 *
    # (0.1 + 100 * 0.05) = 122.4 -> 2.
    trace = steady(16.0, 120.0, 100) + [(40.0 + i / 48.0, 1000, 100, 0.0) for i in range(480)]
    oracle = OraclePlanner(policy(), PERF, requests=trace)
    assert oracle.cap == {P: 3, D: 2}  # static-peak: [0, 60) has 24 rps
    assert oracle.mean_need(30.0, 60.0) == {P: 3, D: 2}
    d = oracle.plan(observation(30.0))
    assert d.desired[D] == 2 and d.reasons[P] == "oracle-ttft"
    # [90, 120): window [75, 135) has 45 s x 16 rps = 720 / 60 s = 12 rps -> 1.5 -> 2
    assert oracle.mean_need(90.0, 120.0)[P] == 2
    # given only the future load (no per-request trace), prefill is the window rule too
    window_only = OraclePlanner(policy(), PERF, future=oracle.future, cap=oracle.cap)
    assert window_only.plan(observation(30.0)).desired == {P: 3, D: 2}


def test_oracle_never_runs_more_than_static_peak() -> None:
    # the burst [50, 70) straddles static-peak's windows [0, 60) and [60, 120): each has
    # 24 rps -> 3; the oracle's window [30, 90) for [45, 75) has 32 rps -> 4, capped at 3
    trace = steady(16.0, 120.0, 100) + [(50.0 + i / 48.0, 1000, 100, 0.0) for i in range(960)]
    oracle = OraclePlanner(policy(), PERF, requests=trace)
    assert oracle.cap is not None and oracle.cap[P] == 3
    uncapped = OraclePlanner(policy(), PERF, requests=trace, cap={P: 9, D: 9})
    assert uncapped.mean_need(45.0, 75.0)[P] == 4
    assert oracle.mean_need(45.0, 75.0)[P] == 3
    peak = StaticPlanner(policy(), PERF, requests=trace).plan(observation()).desired
    for t in range(0, 120, 5):
        need = oracle.mean_need(float(t), t + 30.0)
        assert need[P] <= peak[P] and need[D] <= oracle.need(float(t), t + 30.0)[D] <= peak[D]


def test_oracle_window_starts_at_the_first_arrival() -> None:
    # 20 rps from t = 0: the window of [0, 30) is [0, 45), not [-15, 45) (nothing arrived
    # before the trace): 20k tok/s / 8k = 2.5 -> 3 (an unclipped window would say 15 rps -> 2)
    oracle = OraclePlanner(policy(), PERF, requests=steady(20.0, 120.0, 100))
    assert oracle.mean_need(0.0, 30.0)[P] == 3


def test_oracle_counts_sequences_still_decoding() -> None:
    # 16 rps for 60 s, OSL 1000: R = 0.1 + 50 s; at t = 60 the arrivals of [9.9, 60) = 801
    # sequences are in flight -> ceil(8.01) = 9, although nothing arrives after t = 60 (the
    # window [45, 105) alone says 4 rps * 50.1 s = 200 -> 3).
    oracle = OraclePlanner(policy(), PERF, requests=steady(16.0, 60.0, 1000))
    d = oracle.plan(observation(60.0))
    assert d.desired == {P: 1, D: 9} and d.reasons[D] == "oracle-itl"


def test_prefill_queue_replicas_by_hand() -> None:
    # four 1.5 s prefills at t = 0, target 2 s: N servers serve N of them at 1.5 s, the next
    # N at 3 s (missed); so all four need 4, three of four (0.75) need 3
    burst = [(0.0, 1.5, 1.5, True)] * 4
    assert prefill_queue_replicas(burst, 0, 2.0, 1.0, 16) == 4
    assert prefill_queue_replicas(burst, 0, 2.0, 0.75, 16) == 3
    assert prefill_queue_replicas(burst, 0, 2.0, 1.0, 2) == 2  # capped at the pool's max
    # a 3 s prefill misses on any fleet: it buys no replica (1, not 16)
    assert prefill_queue_replicas([(0.0, 3.0, 3.0, False)], 0, 2.0, 0.99, 16) == 1
    two = [(0.0, 3.0, 3.0, False), (0.0, 1.0, 1.0, True)]
    assert prefill_queue_replicas(two, 0, 2.0, 1.0, 16) == 2
    # the warm-up job (before `first`) is the inherited backlog: a 1.2 s prefill arriving at
    # 0.5 s behind a 1.5 s one starts at 1.5 s and is done at 2.7 s (TTFT 2.2 s > 2 s)
    warm = [(0.0, 1.5, 1.5, True), (0.5, 1.2, 1.2, True)]
    assert prefill_queue_replicas(warm, 1, 2.0, 1.0, 16) == 2
    assert prefill_queue_replicas(warm[1:], 0, 2.0, 1.0, 16) == 1
    assert prefill_queue_replicas([], 0, 2.0, 1.0, 16) == 0
    # the KV transfer delays the first token, not the server: two jobs of 0.5 s busy and
    # 1.2 s own TTFT on one server: the second starts at 0.5 s (not 1.2 s), TTFT 1.7 s
    assert prefill_queue_replicas([(0.0, 0.5, 1.2, True)] * 2, 0, 2.0, 1.0, 16) == 1
    assert prefill_queue_replicas([(0.0, 1.0, 1.6, True)] * 2, 0, 2.0, 1.0, 16) == 2


def test_oracle_sizes_prefill_for_the_queue_the_intervals_requests_form() -> None:
    # 30 prompts of 1000 tokens (0.1 s each) every 10 s: 3 rps, 3k tok/s -> the window-mean
    # rule says 1 replica, but each clump queues for 3 s on one (TTFTs 0.1 .. 3.0 s: 20 of
    # 30 within 2 s); on 2 the last of 15 is done at 1.5 s, so the oracle runs 2
    clumps = [(10.0 * k, 1000, 10, 0.0) for k in range(12) for _ in range(30)]
    oracle = OraclePlanner(policy(), PERF, requests=clumps)
    assert oracle.mean_need(30.0, 60.0)[P] == 1
    assert oracle.need(30.0, 60.0)[P] == 2
    assert oracle.plan(observation(30.0)).desired[P] == 2
    # not capped at static-peak's window count (1): that fleet misses a third of them
    assert oracle.cap is not None and oracle.cap[P] == 1
    # prompts are priced uncached: the trace's infinite-cache hit is not what replicas keep
    cached = [(a, isl, osl, 0.9) for a, isl, osl, _ in clumps]
    assert OraclePlanner(policy(), PERF, requests=cached).need(30.0, 60.0)[P] == 2
    # spread evenly instead (one every 1/3 s), one replica meets every TTFT: it asks for 1
    spread = [(i / 3.0, 1000, 10, 0.0) for i in range(360)]
    assert OraclePlanner(policy(), PERF, requests=spread).need(30.0, 60.0)[P] == 1


def test_every_planner_is_registered_and_takes_policy_model_options() -> None:
    assert set(planner_names()) >= {
        "pdorch",
        "oracle",
        "static-peak",
        "static-mean",
        "hpa-kv-util",
        "dynamo-planner",
        "llmd-slo",
        "aibrix-kpa",
    }
    extra: dict[str, dict[str, Any]] = {
        "oracle": {"requests": steady(1.0, 10.0, 10)},
        "oracle-cold": {"requests": steady(1.0, 10.0, 10)},
        "static-peak": {"prefill": 1, "decode": 1},
        "static-mean": {"prefill": 1, "decode": 1},
    }
    for name in planner_names():
        pl = planner_factory(name)(policy(), PERF, **extra.get(name, {}))
        decision = pl.plan(observation(0.0, rate=1.0))
        assert set(decision.desired) == {P, D} and set(decision.reasons) == {P, D}
