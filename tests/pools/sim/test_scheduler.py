"""The scheduler on its own: its fast-forward mode against its one-step cycle, and its parts."""

from __future__ import annotations

import copy
from typing import Any

from pools.sim.config import EngineConfig
from pools.sim.outputs import StepResult
from pools.sim.request import SimRequest
from pools.sim.scheduler import Scheduler
from pools.sim.timing import make_timing
from transfer.params import KvTransferParams

TIMING = make_timing("llama-3.1-8b", "h100")


def make_scheduler(**kw: Any) -> Scheduler:
    cfg: dict[str, Any] = {"block_size": 16, "num_gpu_blocks": 120, "vocab_size": 4096}
    cfg.update(kw)
    config = EngineConfig(**cfg)
    assert config.num_gpu_blocks is not None
    return Scheduler(config, config.num_gpu_blocks, 4096)


def one_step(s: Scheduler, now: float) -> StepResult:
    """schedule -> the step's cost -> update_from_output (what EngineCore.step does)."""
    so = s.schedule(now)
    d = TIMING.step_time(
        so.num_scheduled_tokens,
        len(so.scheduled),
        so.attn_ctx_tokens,
        so.kv_read_tokens,
        num_new_seqs=so.num_new_seqs,
    )
    return s.update_from_output(so, d)


def prompt(n: int, start: int = 1) -> list[int]:
    return [(start + i) % 4000 + 10 for i in range(n)]


def snapshot(s: Scheduler) -> Any:
    pool = s.kv_cache_manager.block_pool
    return (
        {
            rid: (r.num_tokens, r.num_computed_tokens, r.num_output_tokens, r.num_cached_blocks)
            for rid, r in s.requests.items()
        },
        {rid: [b.block_id for b in r.blocks] for rid, r in s.requests.items()},
        s.busy_until,
        s.counters,
        pool.free_block_queue.block_ids(),
        sorted(pool.cached_block_hash_to_block),
    )


def test_fast_forward_mode_equals_the_one_step_cycle() -> None:
    s = make_scheduler()
    t = 0.0
    for i, (n, out) in enumerate(((300, 200), (520, 90), (77, 300))):
        s.add_request(SimRequest(f"r{i}", prompt(64) + prompt(n, 100 * i + 7), max_tokens=out))
    for _ in range(3):
        t = one_step(s, t).end
    s.kv_cache_manager.take_events()
    other = copy.deepcopy(s)
    ff = s.fast_forward_decode(t, t + 0.35, TIMING.step_time)
    assert ff is not None and ff.num_steps > 20
    ends = []
    tokens: dict[str, list[int]] = {}
    for _ in range(ff.num_steps):
        res = one_step(other, t)
        t = res.end
        ends.append(t)
        for o in res.outputs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert ends == ff.step_ends
    assert snapshot(s) == snapshot(other)
    assert s.kv_cache_manager.take_events() == other.kv_cache_manager.take_events()
    assert dict(zip(ff.request_ids, ff.new_token_ids, strict=True)) == tokens
    # max_steps bounds the stretch; a waiting request turns the mode off
    assert (m := s.fast_forward_decode(t, t + 10, TIMING.step_time, max_steps=2)) is not None
    assert m.num_steps == 2
    s.add_request(SimRequest("new", prompt(40), max_tokens=5))
    assert s.fast_forward_decode(m.end, m.end + 10, TIMING.step_time) is None


def test_held_blocks_live_in_the_transfer_lease_table() -> None:
    s = make_scheduler(kv_lease_duration_s=10.0)
    params = KvTransferParams.prefill_request()
    s.add_request(SimRequest("p", prompt(50), max_tokens=1, kv_transfer_params=params))
    res = one_step(s, 0.0)
    (out,) = res.outputs
    assert out.kv_transfer_params is not None
    leases = s.connector.leases
    lease = leases.get("p")
    assert lease is not None and lease.expires_at == res.end + 10.0
    assert list(lease.block_ids) == out.kv_transfer_params.first_group()
    assert leases.blocks_held == 4
    # the same id finishing again while still held: the old blocks are freed, not leaked
    s.add_request(SimRequest("p", prompt(50, 500), max_tokens=1, kv_transfer_params=params))
    one_step(s, res.end)
    assert leases.blocks_held == 4 and len(leases) == 1
    pool = s.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1 - 4
    assert s.connector.extend("p", 100.0) and leases.next_expiry() == 110.0
    assert s.next_step_time(100.0) == 110.0
    one_step(s, 110.0)
    assert leases.blocks_held == 0 and pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
