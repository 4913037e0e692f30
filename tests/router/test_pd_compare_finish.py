"""The queue-aware local prefill of the P/D decision (`compare_finish`, router/pd_decision.py)."""

from __future__ import annotations

from router.pd_decision import PdDecisionParams, decide_pd
from router.replica_state import ReplicaSnapshot, RoutingRequest

BS = 16


def _req(prompt: int) -> RoutingRequest:
    return RoutingRequest("q", prompt, BS, tuple(range(prompt // BS)), max_tokens=64)


def test_off_by_default_the_rule_disaggregates_past_a_queued_pool() -> None:
    pool = [ReplicaSnapshot("p0", prefill_tokens_queued=9_000, prefill_tokens_per_s=10_000.0)]
    idle = ReplicaSnapshot("d0", prefill_tokens_per_s=10_000.0)
    got = decide_pd(_req(4000), pool, PdDecisionParams(), 0.0, local=idle)
    assert got.disaggregate  # 0.9 s queue < max_prefill_queue_s 1.0


def test_a_queued_pool_loses_to_an_idle_decode_replica_by_the_weighted_finish() -> None:
    # remote: (9000 + 4000) / 10k = 1.3 s + 4000 * 3.3e-6 pulled; local: 3 * 0.4 s = 1.2 s.
    pool = [ReplicaSnapshot("p0", prefill_tokens_queued=9_000, prefill_tokens_per_s=10_000.0)]
    idle = ReplicaSnapshot("d0", prefill_tokens_per_s=10_000.0)
    params = PdDecisionParams(compare_finish=True)
    got = decide_pd(_req(4000), pool, params, 0.0, local=idle)
    assert not got.disaggregate and "sooner" in got.reason
    # A lighter pool (0.7 s of queue) wins again: 1.1 + 0.013 < 1.2.
    pool[0].prefill_tokens_queued = 7_000
    assert decide_pd(_req(4000), pool, params, 0.0, local=idle).disaggregate
    # Without the decode replica's snapshot the check cannot run: the plain rule decides.
    pool[0].prefill_tokens_queued = 9_000
    assert decide_pd(_req(4000), pool, params, 0.0).disaggregate
