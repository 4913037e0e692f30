"""One set of counters: what `/metrics` renders is the core's `EngineStats`, nothing else."""

from __future__ import annotations

from typing import Any

from pools.sim.config import EngineConfig
from pools.sim.engine_core import EngineCore
from pools.sim.metrics import EngineMetrics
from pools.sim.request import SimRequest
from pools.sim.timing import make_timing
from transfer.params import KvTransferParams


def parse(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def busy_core() -> EngineCore:
    """Cache hits, a preemption, an abort, a held prefill leg: every counter moves."""
    cfg: dict[str, Any] = {"block_size": 16, "num_gpu_blocks": 50, "vocab_size": 4096}
    core = EngineCore(EngineConfig(**cfg), make_timing("llama-3.1-8b", "h100"))
    shared = [(i % 4000) + 10 for i in range(160)]
    for i in range(5):
        core.add_request(SimRequest(f"r{i}", shared + [900 + i] * 40, max_tokens=250), 0.0)
    core.add_request(
        SimRequest(
            "p", shared[:60], max_tokens=1, kv_transfer_params=KvTransferParams.prefill_request()
        ),
        0.0,
    )
    t = 0.0
    for _ in range(40):
        t = core.step(t).end
    core.abort_request("r4", t)
    while core.has_unfinished():
        t = core.step(t).end
    return core


def test_metrics_render_the_cores_counters() -> None:
    core = busy_core()
    st = core.stats()
    assert st.num_preemptions > 0 and st.prefix_cache_hits > 0 and st.num_held_blocks > 0
    base = 'engine="0",model_name="m"'
    got = parse(EngineMetrics("m").render(st, client_aborts=1))
    assert got[f"vllm:num_requests_running{{{base}}}"] == st.num_running
    assert got[f"vllm:num_requests_waiting{{{base}}}"] == st.num_waiting
    assert got[f"vllm:kv_cache_usage_perc{{{base}}}"] == st.kv_cache_usage
    for name, value in (
        ("prefix_cache_queries", st.prefix_cache_queries),
        ("prefix_cache_hits", st.prefix_cache_hits),
        ("external_prefix_cache_queries", st.external_prefix_cache_queries),
        ("external_prefix_cache_hits", st.external_prefix_cache_hits),
        ("num_preemptions", st.num_preemptions),
        ("prompt_tokens", st.prompt_tokens),
        ("generation_tokens", st.generation_tokens),
    ):
        assert got[f"vllm:{name}_total{{{base}}}"] == value, name
    for source, value in st.prompt_tokens_by_source.items():
        key = f'vllm:prompt_tokens_by_source_total{{{base},source="{source}"}}'
        assert got[key] == value
    for reason, value in st.request_success.items():
        key = f'vllm:request_success_total{{engine="0",finished_reason="{reason}",model_name="m"}}'
        # the frontend's own abort (client gone) is not an engine finish (vLLM 0.32)
        assert got[key] == (value - 1 if reason == "abort" else value), reason
    assert st.request_success["abort"] == 1


def test_metrics_before_the_core_exists_are_zero() -> None:
    got = parse(EngineMetrics("m").render(None))
    assert got['vllm:generation_tokens_total{engine="0",model_name="m"}'] == 0
    assert got['vllm:num_requests_running{engine="0",model_name="m"}'] == 0
