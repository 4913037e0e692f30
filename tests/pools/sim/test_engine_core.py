"""The engine core in virtual time: a fake clock, no server, no sleeps."""

from __future__ import annotations

from typing import Any

import pytest

from pools.sim.config import EngineConfig
from pools.sim.engine_core import EngineCore, RequestOutput, StepResult
from pools.sim.hashing import request_block_hashes, to_external_hash
from pools.sim.kv_events import BlockStored
from pools.sim.request import SimRequest
from pools.sim.timing import TimingModel, make_timing
from pools.sim.token_gen import TokenGenerator
from transfer.params import KvTransferParams

TIMING = make_timing("llama-3.1-8b", "h100")


class FakeClock:
    """Virtual time: advances only when the test says so."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t


def make_core(timing: TimingModel = TIMING, **kw: Any) -> EngineCore:
    cfg: dict[str, Any] = {"block_size": 16, "num_gpu_blocks": 1000, "vocab_size": 4096}
    cfg.update(kw)
    return EngineCore(EngineConfig(**cfg), timing)


def drive(
    core: EngineCore, clock: FakeClock, max_steps: int = 100_000
) -> tuple[dict[str, list[RequestOutput]], list[StepResult]]:
    """Step while requests are unfinished, advancing the fake clock by each step's duration."""
    outs: dict[str, list[RequestOutput]] = {}
    steps: list[StepResult] = []
    while core.has_unfinished():
        t = core.next_step_time(clock.t)
        assert t is not None, "unfinished requests but nothing to do"
        res = core.step(t)
        clock.t = res.end
        steps.append(res)
        for o in res.outputs:
            outs.setdefault(o.request_id, []).append(o)
        assert len(steps) < max_steps
    return outs, steps


def tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def prompt(n: int, start: int = 1) -> list[int]:
    return [(start + i) % 4000 + 10 for i in range(n)]


def test_virtual_time_run_lifecycle_and_timing() -> None:
    clock = FakeClock()
    core = make_core()
    core.add_request(SimRequest("a", prompt(100), max_tokens=5), clock.t)
    core.add_request(SimRequest("b", prompt(40, 7), max_tokens=3), clock.t)
    t0 = clock.t
    outs, steps = drive(core, clock)
    assert tokens(outs["a"]) == TokenGenerator(4096).tokens(prompt(100), None, 5)
    assert outs["a"][0].is_first_token and not outs["a"][1].is_first_token
    assert outs["a"][-1].finished and outs["a"][-1].finish_reason == "length"
    assert outs["b"][-1].num_output_tokens == 3
    # durations come from the timing model and the clock only moved by them
    assert clock.t == pytest.approx(t0 + sum(s.duration_s for s in steps))
    first = steps[0]
    assert first.num_prefill_tokens == 140
    assert first.duration_s == pytest.approx(TIMING.step_time(140, 2, 100 * 50.5 + 40 * 20.5, 140))
    assert core.next_step_time(clock.t) is None
    st = core.stats()
    assert st.num_running == st.num_waiting == 0 and st.kv_cache_usage == 0.0
    assert st.generation_tokens == 8 and st.request_success["length"] == 2
    assert st.prompt_tokens == 140


def test_chunked_prefill_respects_budget_and_max_seqs() -> None:
    clock = FakeClock()
    core = make_core(max_num_batched_tokens=64, max_num_seqs=2)
    for i in range(3):
        core.add_request(SimRequest(f"r{i}", prompt(100, i * 300), max_tokens=2), clock.t)
    res = core.step(clock.t)
    assert res.num_scheduled_tokens == 64 and res.outputs == []
    assert core.stats().num_running == 1  # the budget went to r0's first chunk
    clock.t = res.end
    res = core.step(clock.t)  # r0's 36 remaining + 28 of r1
    assert res.num_scheduled_tokens == 64
    assert [o.request_id for o in res.outputs] == ["r0"]
    assert core.stats().num_running == 2 and core.stats().num_waiting == 1  # max_num_seqs
    _, steps = drive(core, clock)
    assert all(s.num_scheduled_tokens <= 64 for s in steps)
    assert core.stats().request_success["length"] == 3


def test_prefix_cache_accounting_in_tokens_like_vllm() -> None:
    clock = FakeClock()
    core = make_core()
    p = prompt(100)
    core.add_request(SimRequest("a", p, max_tokens=2), clock.t)
    drive(core, clock)
    core.add_request(SimRequest("b", p, max_tokens=2), clock.t)
    core.add_request(SimRequest("c", [*p[:40], 9, 9, 9], max_tokens=2), clock.t)
    outs, _ = drive(core, clock)
    st = core.stats()
    # queries = prompt tokens of each request; hits = cached full blocks (max num_tokens - 1)
    assert st.prefix_cache_queries == 100 + 100 + 43
    assert st.prefix_cache_hits == 0 + 96 + 32
    assert outs["b"][0].num_local_cached_tokens == 96
    assert outs["b"][0].num_local_compute_tokens == 4
    assert st.prompt_tokens_by_source == {
        "local_compute": 100 + 4 + 11,
        "local_cache_hit": 96 + 32,
        "external_kv_transfer": 0,
    }
    # same prompt => same tokens, whatever the cache did
    assert tokens(outs["b"]) == TokenGenerator(4096).tokens(p, None, 2)


def test_block_stored_events_match_request_hashes() -> None:
    clock = FakeClock()
    core = make_core()
    p = prompt(70)
    core.add_request(SimRequest("a", p, max_tokens=30, cache_salt="s1"), clock.t)
    outs, _ = drive(core, clock)
    events = [e for e in core.drain_events() if isinstance(e, BlockStored)]
    stored = [h for e in events for h in e.block_hashes]
    full = [*p, *tokens(outs["a"])]
    # 100 tokens; the last output token is never computed, so 6 full blocks get cached
    expected = request_block_hashes(full[:96], 16, cache_salt="s1")
    assert stored == [to_external_hash(h) for h in expected]
    assert events[0].extra_keys is not None and events[0].extra_keys[0] == ("s1",)
    assert events[0].parent_block_hash is None
    assert events[1].parent_block_hash == stored[len(events[0].block_hashes) - 1]


def test_preemption_by_recompute_when_blocks_run_out() -> None:
    clock = FakeClock()
    core = make_core(num_gpu_blocks=11)  # 10 usable blocks = 160 tokens
    core.add_request(SimRequest("a", prompt(60), max_tokens=60), clock.t)
    core.add_request(SimRequest("b", prompt(60, 500), max_tokens=60), clock.t)
    outs, steps = drive(core, clock)
    st = core.stats()
    assert st.num_preemptions >= 1 and sum(s.num_preempted for s in steps) == st.num_preemptions
    assert max(o.num_preemptions for o in outs["b"]) >= 1
    # recompute does not change what is generated
    assert tokens(outs["a"]) == TokenGenerator(4096).tokens(prompt(60), None, 60)
    assert tokens(outs["b"]) == TokenGenerator(4096).tokens(prompt(60, 500), None, 60)
    assert st.preempted_prefix_cache_queries > 0
    assert st.prefix_cache_queries == 120  # preempted re-lookups count apart, as in vLLM
    assert st.kv_cache_usage == 0.0


def test_stop_tokens_min_tokens_and_max_model_len() -> None:
    gen = TokenGenerator(4096)
    p = prompt(20)
    seq = gen.tokens(p, 3, 10)
    clock = FakeClock()
    core = make_core(max_model_len=25)
    core.add_request(SimRequest("stop", p, max_tokens=10, seed=3, stop_token_ids=[seq[2]]), 0)
    core.add_request(
        SimRequest("min", p, max_tokens=10, seed=3, stop_token_ids=[seq[2]], min_tokens=4), 0
    )
    outs, _ = drive(core, clock)
    assert tokens(outs["stop"]) == seq[:3]
    assert outs["stop"][-1].finish_reason == "stop" and outs["stop"][-1].stop_reason == seq[2]
    assert len(tokens(outs["min"])) == 5  # 20 + 5 = max_model_len
    assert outs["min"][-1].finish_reason == "length"
    with pytest.raises(ValueError, match="prompt_token_ids"):
        core.add_request(SimRequest("long", prompt(25), max_tokens=1), 0)
    with pytest.raises(ValueError, match="max_tokens"):
        core.add_request(SimRequest("zero", prompt(5), max_tokens=0), 0)


def test_eos_never_generated_and_seed_changes_tokens() -> None:
    gen = TokenGenerator(50, exclude=[7])
    toks = gen.tokens(prompt(10), 1, 2000)
    assert 7 not in toks and set(toks) <= set(range(50))
    assert gen.tokens(prompt(10), 1, 50) != gen.tokens(prompt(10), 2, 50)
    assert gen.tokens(prompt(10), 1, 50) == TokenGenerator(50, exclude=[7]).tokens(
        prompt(10), 1, 50
    )


def test_abort_frees_blocks() -> None:
    clock = FakeClock()
    core = make_core()
    core.add_request(SimRequest("a", prompt(50), max_tokens=100), clock.t)
    clock.t = core.step(clock.t).end
    assert core.stats().kv_cache_usage > 0
    out = core.abort_request("a", clock.t)
    assert out is not None and out.finish_reason == "abort"
    assert core.abort_request("a", clock.t) is None
    st = core.stats()
    assert st.kv_cache_usage == 0.0 and st.request_success["abort"] == 1
    assert not core.has_unfinished()


# ----------------------------------------------------------------------------- P/D


def prefill_leg(core: EngineCore, clock: FakeClock, rid: str, p: list[int]) -> KvTransferParams:
    core.add_request(
        SimRequest(rid, p, max_tokens=1, kv_transfer_params=KvTransferParams.prefill_request()),
        clock.t,
    )
    outs, _ = drive(core, clock)
    last = outs[rid][-1]
    assert last.finished and last.finish_reason == "length"
    assert last.kv_transfer_params is not None
    return last.kv_transfer_params


def test_prefill_leg_holds_blocks_until_release_or_lease() -> None:
    clock = FakeClock()
    p_core = make_core(engine_id="P1", kv_host="10.0.0.1", kv_port=7777, kv_lease_duration_s=30)
    params = prefill_leg(p_core, clock, "x", prompt(50))
    assert params.wire() == {  # every key vLLM 0.32's NixlConnector returns
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [[1, 2, 3, 4]],
        "remote_engine_id": "P1",
        "remote_request_id": "x",
        "remote_host": "10.0.0.1",
        "remote_port": 7777,
        "tp_size": 1,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": 50,
        "remote_blocks_expiry_time": None,
        "transfer_mode": "pull",
        "remote_prefill_cached_tokens": 0,
    }
    st = p_core.stats()
    assert st.num_held_requests == 1 and st.num_held_blocks == 4 and st.kv_cache_usage > 0
    assert p_core.release_held("x", clock.t) is True
    assert p_core.release_held("x", clock.t) is False
    assert p_core.stats().kv_cache_usage == 0.0

    params = prefill_leg(p_core, clock, "y", prompt(50, 900))
    finished_at = clock.t
    expiry = p_core.next_step_time(clock.t)
    assert expiry is not None and expiry == pytest.approx(finished_at + 30)
    p_core.step(finished_at + 29.9)
    assert p_core.stats().num_held_blocks == 4
    p_core.step(expiry)
    assert p_core.stats().num_held_blocks == 0 and p_core.stats().kv_cache_usage == 0.0
    assert p_core.next_step_time(clock.t) is None


def test_remote_load_flow_decodes_without_recompute_and_matches_colocated() -> None:
    clock = FakeClock()
    p = prompt(150)
    colo = make_core()
    colo.add_request(SimRequest("c", p, max_tokens=20, seed=5), clock.t)
    ref = tokens(drive(colo, clock)[0]["c"])

    p_core = make_core(engine_id="P")
    d_core = make_core(engine_id="D")
    # D already caches the first 64 tokens of this prompt (local prefix hit reused)
    d_core.add_request(SimRequest("warm", p[:70], max_tokens=1), clock.t)
    drive(d_core, clock)
    d_core.drain_events()
    params = prefill_leg(p_core, clock, "x", p)

    d_core.add_request(SimRequest("x", p, max_tokens=20, seed=5, kv_transfer_params=params), 0)
    res = d_core.step(clock.t)
    assert res.num_scheduled_tokens == 0 and res.duration_s == 0.0
    (load,) = res.new_remote_loads
    assert load.first_block == 4 and load.num_tokens == 150 - 64
    assert load.remote_block_ids == params.block_ids()[4:]
    assert len(load.local_block_ids) == len(load.remote_block_ids) == 6
    assert load.remote_engine_id == "P" and load.remote_request_id == "x"
    assert d_core.pending_remote_loads() == [load]
    assert d_core.stats().num_waiting_for_remote_kvs == 1
    assert d_core.next_step_time(clock.t) is None  # nothing to compute while loading

    clock.t += TIMING.kv_transfer_time(load.num_tokens)
    d_core.finish_remote_load("x", True, clock.t)
    assert p_core.release_held("x", clock.t)
    outs, steps = drive(d_core, clock)
    # no recompute: only the last prompt token is computed before the first token
    assert steps[0].num_scheduled_tokens == 1
    assert sum(s.num_prefill_tokens for s in steps) == 1
    assert tokens(outs["x"]) == ref
    first = outs["x"][0]
    assert first.num_local_cached_tokens == 64 and first.num_external_tokens == 86
    assert first.num_local_compute_tokens == 0
    st = d_core.stats()
    assert st.prompt_tokens_by_source["external_kv_transfer"] == 86
    assert st.prefix_cache_hits == 64
    # the received blocks are cached and published (as vLLM's decode side does)
    stored = [
        h for e in d_core.drain_events() if isinstance(e, BlockStored) for h in e.block_hashes
    ]
    want = request_block_hashes(p, 16)[4:9]
    assert stored[:5] == [to_external_hash(h) for h in want]


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_remote_load_failure_policy(policy: str) -> None:
    clock = FakeClock()
    p = prompt(80)
    p_core = make_core()
    params = prefill_leg(p_core, clock, "x", p)
    d_core = make_core(kv_load_failure_policy=policy)
    d_core.add_request(SimRequest("x", p, max_tokens=4, kv_transfer_params=params), clock.t)
    d_core.step(clock.t)
    d_core.finish_remote_load("x", False, clock.t)
    outs, steps = drive(d_core, clock)
    if policy == "fail":
        assert outs["x"][-1].finish_reason == "error" and tokens(outs["x"]) == []
        assert d_core.stats().request_success["error"] == 1
    else:
        assert tokens(outs["x"]) == TokenGenerator(4096).tokens(p, None, 4)
        assert sum(s.num_prefill_tokens for s in steps) == 80  # prefilled locally
        assert outs["x"][0].num_external_tokens == 0
    assert d_core.stats().kv_cache_usage == 0.0


def test_many_requests_step_cost_is_bounded() -> None:
    """A smoke check that a busy core keeps stepping (real speed lives in benchmarks)."""
    clock = FakeClock()
    core = make_core(num_gpu_blocks=400, max_num_batched_tokens=2048)
    for i in range(200):
        core.add_request(SimRequest(f"r{i}", prompt(200, i * 7), max_tokens=30), clock.t)
    outs, _ = drive(core, clock)
    assert len(outs) == 200 and all(o[-1].finished for o in outs.values())
    assert core.stats().kv_cache_usage == 0.0


def test_extend_lease_postpones_expiry() -> None:
    clock = FakeClock()
    core = make_core(kv_lease_duration_s=10)
    prefill_leg(core, clock, "x", prompt(40))
    t_end = clock.t
    assert core.extend_lease("x", t_end + 5) is True
    assert core.next_step_time(t_end) == pytest.approx(t_end + 15)
    core.step(t_end + 10)
    assert core.stats().num_held_requests == 1
    core.step(t_end + 15)
    assert core.stats().num_held_requests == 0
    assert core.extend_lease("x", t_end + 16) is False


def test_abort_while_loading_frees_blocks_and_load() -> None:
    clock = FakeClock()
    p = prompt(64)
    params = prefill_leg(make_core(), clock, "x", p)
    d_core = make_core()
    d_core.add_request(SimRequest("x", p, max_tokens=4, kv_transfer_params=params), clock.t)
    d_core.step(clock.t)
    assert d_core.stats().num_waiting_for_remote_kvs == 1 and d_core.stats().kv_cache_usage > 0
    out = d_core.abort_request("x", clock.t)
    assert out is not None and out.finish_reason == "abort"
    st = d_core.stats()
    assert st.num_waiting_for_remote_kvs == 0 and st.kv_cache_usage == 0.0
    assert d_core.pending_remote_loads() == [] and not d_core.has_unfinished()
    d_core.finish_remote_load("x", True, clock.t)  # late completion is ignored
    assert d_core.next_step_time(clock.t) is None


def test_prefix_caching_disabled_no_hits_no_events() -> None:
    clock = FakeClock()
    core = make_core(enable_prefix_caching=False)
    p = prompt(100)
    for rid in ("a", "b"):
        core.add_request(SimRequest(rid, p, max_tokens=3), clock.t)
        outs, _ = drive(core, clock)
        assert outs[rid][0].num_local_cached_tokens == 0
    st = core.stats()
    assert st.prefix_cache_queries == st.prefix_cache_hits == 0
    assert st.prompt_tokens_by_source["local_compute"] == 200
    assert core.drain_events() == []


def test_a_sequence_continued_from_its_own_tokens_goes_on_as_the_uninterrupted_run() -> None:
    # the coordinator's stream migration resends prompt + generated as a longer prompt
    gen = TokenGenerator(4096)
    p = prompt(30)
    for seed in (None, 7):
        whole = gen.tokens(p, seed, 12)
        assert gen.tokens(p + whole[:5], seed, 7) == whole[5:]
    assert gen.tokens(p, None, 12) != gen.tokens(prompt(31), None, 12)
