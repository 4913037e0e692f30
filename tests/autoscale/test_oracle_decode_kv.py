"""The oracle's KV-in-flight decode term (`autoscale/baselines/oracle_decode.py`), by hand."""

from __future__ import annotations

from autoscale.baselines.oracle import OraclePlanner
from autoscale.baselines.oracle_decode import (
    decode_in_flight_quantile,
    decode_kv_in_flight_quantile,
)
from autoscale.perf_model import TimingPerfModel
from autoscale.signals import Pool
from pools.sim.timing import make_timing
from tests.autoscale.obs import policy
from tests.autoscale.perf_double import LinearPerfModel

D = Pool.DECODE


def test_kv_in_flight_weights_each_sequence_by_the_tokens_it_holds() -> None:
    # entries at a + 0.5 s, residence 10 tokens x 0.1 s = 1 s: the three 0.0 s arrivals are in
    # flight together (1,000 + 2,000 + 3,000 tokens), the 1.0 s one enters at 1.5 s alone
    jobs = [(0.0, 0.5, 10), (0.0, 0.5, 10), (0.0, 0.5, 10), (1.0, 0.5, 10)]
    kv = [1000.0, 2000.0, 3000.0, 500.0]
    arrivals = [j[0] for j in jobs]
    assert decode_kv_in_flight_quantile(jobs, kv, arrivals, 0.0, 2.0, 0.1, 0.99, 10.0) == 6000.0
    # the four entries hold 1,000, 3,000, 6,000 and 500 tokens: the median is the second
    assert decode_kv_in_flight_quantile(jobs, kv, arrivals, 0.0, 2.0, 0.1, 0.5, 10.0) == 1000.0
    # no arrival in [1.6, 3): the 500-token sequence still decoding (exit 2.5 s) is counted
    assert decode_kv_in_flight_quantile(jobs, kv, arrivals, 1.6, 3.0, 0.1, 0.99, 10.0) == 500.0
    # unit weights give the sequence count
    assert decode_kv_in_flight_quantile(
        jobs, [1.0] * 4, arrivals, 0.0, 2.0, 0.1, 0.99, 10.0
    ) == decode_in_flight_quantile(jobs, arrivals, 0.0, 2.0, 0.1, 0.99, 10.0)


def test_the_oracle_sizes_decode_for_the_kv_of_long_prompts_the_mean_context_hides() -> None:
    # 8 short requests (1,000 + 100 tokens) and 2 long ones (30,000 + 100) within 10 ms: the
    # window's mean context is (6,000 + 50) -> 6,050 tokens, B = 100,000 // 6,050 = 16, so the
    # count asks ceil(10 / 16) = 1 replica; the KV in flight is 8 x 1,050 + 2 x 30,050 = 68,500
    # tokens (ISL + OSL/2 each) over 50,000 usable per replica: 2 replicas
    perf = LinearPerfModel(kv_tokens=50_000, step_per_seq_s=0.0001)
    reqs = [(i * 0.001, 1000, 100, 0.0) for i in range(8)]
    reqs += [(0.008, 30_000, 100, 0.0), (0.009, 30_000, 100, 0.0)]
    on = policy(perf_model={"decode_burst_queue": True})
    assert perf.decode_max_batch(6050, 0.05) == 8  # KV-capped: 50,000 // 6,050
    assert OraclePlanner(on, perf, requests=reqs).need(0.0, 30.0)[D] == 2
    # with room for all of it in one replica's KV, the count decides: 1
    roomy = LinearPerfModel(kv_tokens=100_000, step_per_seq_s=0.0001)
    assert OraclePlanner(on, roomy, requests=reqs).need(0.0, 30.0)[D] == 1


def test_the_timing_model_reports_its_usable_kv_in_whole_blocks() -> None:
    perf = TimingPerfModel(make_timing("llama-3.1-8b", "h100"))
    usable = perf.kv_usable_tokens()
    assert usable % perf.block_size == 0
    assert perf.kv_capacity_tokens - 2 * perf.block_size < usable <= perf.kv_capacity_tokens
    # the batch rule reads the same pool: a quarter of its blocks per sequence fits 4
    quarter = perf.kv_usable_blocks() // 4 * perf.block_size
    assert perf.kv_max_batch(quarter) == 4
    assert perf.kv_max_batch(quarter + perf.block_size) == 3
