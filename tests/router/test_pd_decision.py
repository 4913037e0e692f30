"""The P/D decision: threshold on the uncached prompt, saturation of the prefill pool."""

from __future__ import annotations

from router.pd_decision import PdDecisionParams, decide_pd
from router.replica_state import ReplicaSnapshot, RoutingRequest

PARAMS = PdDecisionParams(min_uncached_tokens=512, max_prefill_queue_s=1.0)


def req(prompt: int) -> RoutingRequest:
    return RoutingRequest(request_id="r", prompt_tokens=prompt, block_size=16)


def prefill(
    rid: str, queued: int, healthy: bool = True, tps: float | None = None
) -> ReplicaSnapshot:
    return ReplicaSnapshot(
        replica_id=rid, healthy=healthy, prefill_tokens_queued=queued, prefill_tokens_per_s=tps
    )


def test_long_uncached_prompt_with_free_prefill_pool_disaggregates() -> None:
    d = decide_pd(req(4096), [prefill("p0", 5000), prefill("p1", 20_000)], PARAMS, 0.0)
    assert d.disaggregate
    assert d.uncached_tokens == 4096
    assert d.min_prefill_queue_s == 0.5  # 5000 / 10000
    assert "disaggregate" in d.reason


def test_short_uncached_prompt_prefills_locally() -> None:
    d = decide_pd(req(300), [prefill("p0", 0)], PARAMS, 0.0)
    assert not d.disaggregate
    assert "300 < 512" in d.reason
    # Long prompt, but the decode replica already caches most of it: 4096 - 240*16 = 256.
    d = decide_pd(req(4096), [prefill("p0", 0)], PARAMS, 0.0, local_overlap_blocks=240)
    assert not d.disaggregate and d.uncached_tokens == 256
    # Exactly at the threshold disaggregates.
    assert decide_pd(req(512), [prefill("p0", 0)], PARAMS, 0.0).disaggregate


def test_saturated_prefill_pool_prefills_locally() -> None:
    pool = [prefill("p0", 15_000), prefill("p1", 30_000, tps=20_000.0)]  # 1.5 s each
    d = decide_pd(req(8192), pool, PARAMS, 0.0)
    assert not d.disaggregate
    assert d.min_prefill_queue_s == 1.5
    assert "saturated" in d.reason
    # One replica under budget is enough; unhealthy ones do not count.
    pool.append(prefill("p2", 0, healthy=False))
    assert not decide_pd(req(8192), pool, PARAMS, 0.0).disaggregate
    pool.append(prefill("p3", 9_000))
    d = decide_pd(req(8192), pool, PARAMS, 0.0)
    assert d.disaggregate and d.min_prefill_queue_s == 0.9 and d.healthy_prefill_replicas == 3


def test_no_prefill_pool_or_disabled() -> None:
    assert "no healthy prefill" in decide_pd(req(8192), [], PARAMS, 0.0).reason
    off = PdDecisionParams(enabled=False)
    d = decide_pd(req(8192), [prefill("p0", 0)], off, 0.0)
    assert not d.disaggregate and "disabled" in d.reason


def test_reasons_read_lazily_are_the_full_texts() -> None:
    # the text once formatted eagerly in `decide_pd`, now built from the decision on read
    yes = decide_pd(req(4096), [prefill("p0", 5000)], PARAMS, 0.0)
    assert not isinstance(yes.why, str)
    assert yes.reason == (
        "uncached prompt 4096 >= 512 tokens and min prefill queue 0.500 s <= 1 s: disaggregate"
    )
    short = decide_pd(req(300), [prefill("p0", 0)], PARAMS, 0.0)
    assert short.reason == "uncached prompt 300 < 512 tokens: decode prefills locally"
    full = decide_pd(req(4096), [prefill("p0", 25_000)], PARAMS, 0.0)
    assert full.reason == (
        "prefill pool saturated (min queue 2.500 s > 1 s): decode prefills locally"
    )
