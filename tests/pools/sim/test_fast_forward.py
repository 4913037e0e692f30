"""Decode fast-forward and the token-free request mode of the engine core (additive APIs)."""

from __future__ import annotations

import copy
from typing import Any

from pools.sim.config import EngineConfig
from pools.sim.engine_core import EngineCore
from pools.sim.hashing import request_block_hashes
from pools.sim.request import SimRequest
from pools.sim.timing import make_timing

TIMING = make_timing("llama-3.1-8b", "h100")


def make_core(**kw: Any) -> EngineCore:
    cfg: dict[str, Any] = {"block_size": 16, "num_gpu_blocks": 400, "vocab_size": 4096}
    cfg.update(kw)
    return EngineCore(EngineConfig(**cfg), TIMING)


def prompt(n: int, start: int = 1) -> list[int]:
    return [(start + i) % 4000 + 10 for i in range(n)]


def state(core: EngineCore) -> Any:
    reqs = {
        rid: (
            r.num_tokens,
            r.num_computed_tokens,
            r.num_output_tokens,
            [b.block_id for b in r.blocks],
            r.num_cached_blocks,
            list(r.all_token_ids),
            list(r.block_hashes),
        )
        for rid, r in core.requests.items()
    }
    st = core.stats()
    return (
        reqs,
        core.busy_until,
        st.num_steps,
        st.generation_tokens,
        st.kv_cache_usage,
        core.block_pool.free_block_queue.block_ids(),
        sorted(core.block_pool.cached_block_hash_to_block),
    )


def prepare(core: EngineCore, token_free: bool) -> float:
    """Three requests sharing a prefix, stepped until all decode; returns the clock."""
    t = 0.0
    for i, (n, out) in enumerate(((300, 200), (520, 90), (77, 300))):
        toks = prompt(64, 1) + prompt(n, 100 * i + 7)
        if token_free:
            hashes = request_block_hashes(toks + prompt(out, 5000 + i), 16)
            req = SimRequest(
                f"r{i}", [], max_tokens=out, num_prompt_tokens=len(toks), block_hashes=hashes
            )
        else:
            req = SimRequest(f"r{i}", toks, max_tokens=out)
        core.add_request(req, t)
    for _ in range(3):
        res = core.step(core.next_step_time(t) or t)
        t = res.end
    assert all(r.first_token_done for r in core.running)
    return t


def test_fast_forward_equals_stepping_one_by_one() -> None:
    for token_free in (False, True):
        # A tight pool so that decode allocations evict cached blocks (BlockRemoved events).
        a = make_core(num_gpu_blocks=120)
        t = prepare(a, token_free)
        a.drain_events()
        b = copy.deepcopy(a)
        until = t + 0.35
        ff = a.fast_forward_decode(t, until)
        assert ff is not None and ff.num_steps > 20
        assert ff.end <= until
        ends = []
        tb = t
        outputs: dict[str, list[int]] = {}
        for _ in range(ff.num_steps):
            res = b.step(b.next_step_time(tb) or tb)
            tb = res.end
            ends.append(res.end)
            for o in res.outputs:
                assert not o.finished
                outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
        assert ends == ff.step_ends
        assert state(a) == state(b)
        assert a.drain_events() == b.drain_events()
        if not token_free:
            assert dict(zip(ff.request_ids, ff.new_token_ids, strict=True)) == outputs


def test_fast_forward_stops_before_a_finish_and_when_not_pure_decode() -> None:
    core = make_core()
    t = prepare(core, token_free=False)
    ff = core.fast_forward_decode(t, t + 1000.0)
    assert ff is not None
    # r1 has 90 outputs: the step producing its last token must run through step()
    r1 = core.requests["r1"]
    assert r1.num_output_tokens == r1.max_tokens - 1
    res = core.step(ff.end)
    assert any(o.request_id == "r1" and o.finished for o in res.outputs)
    # a new waiting request makes the batch not pure decode
    core.add_request(SimRequest("new", prompt(40), max_tokens=5), res.end)
    assert core.fast_forward_decode(res.end, res.end + 10) is None


def test_token_free_request_hits_the_prefix_cache_like_token_ids() -> None:
    toks = prompt(200)
    hashes = request_block_hashes(toks + prompt(40, 900), 16)
    results = []
    for token_free in (False, True):
        core = make_core()
        t = 0.0
        for i in range(2):
            if token_free:
                req = SimRequest(
                    f"q{i}", [], max_tokens=40, num_prompt_tokens=200, block_hashes=hashes
                )
            else:
                req = SimRequest(f"q{i}", toks, max_tokens=40)
            core.add_request(req, t)
            while core.has_unfinished():
                res = core.step(core.next_step_time(t) or t)
                t = res.end
        st = core.stats()
        results.append((st.prefix_cache_queries, st.prefix_cache_hits, st.generation_tokens))
        events = core.drain_events()
        if token_free:
            assert all(not getattr(e, "token_ids", []) for e in events)
    assert results[0] == results[1]
    assert results[1][1] == 192  # 12 full blocks of the 200-token prompt hit the second time
