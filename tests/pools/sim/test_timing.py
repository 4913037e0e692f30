"""Timing model: calibration facts within 15%, and the shape of the formulas."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.calibration import run_checks
from pools.sim.config import EngineConfig
from pools.sim.engine_core import EngineCore
from pools.sim.profiles import GPUS, MODELS, get_gpu, get_model
from pools.sim.request import SimRequest
from pools.sim.timing import TimingModel, make_timing

REPO = Path(__file__).resolve().parents[3]

GIB = 2**30


def within(measured: float, fact: float, tol: float = 0.15) -> bool:
    return abs(measured / fact - 1.0) <= tol


def test_calibration_8b_h100() -> None:
    t60 = make_timing("llama-3.1-8b", "h100", kv_memory_gb=60)
    assert t60.kv_bytes_per_token == 128 * 1024
    assert within(t60.kv_capacity_tokens, 490_000)
    assert within(t60.decode_time(1, 1024) * 1e3, 4.8)
    assert within(t60.decode_time_full_pool() * 1e3, 22.0)
    default = make_timing("llama-3.1-8b", "h100")
    assert within(default.decode_time_full_pool() * 1e3, 22.0)
    # vLLM's accounting (0.9 x 80 GB - 16 GB weights - activations) leaves ~55 GiB of KV
    assert 50 * GIB < default.kv_memory_bytes < 60 * GIB


def test_h200_facts() -> None:
    h100, h200 = get_gpu("h100"), get_gpu("h200")
    assert within(h200.memory_bytes / GIB, 141, 0.02)
    assert h200.hbm_bytes_per_s == 4.8e12 and h200.peak_flops == h100.peak_flops


def test_prefill_is_compute_bound_and_superlinear() -> None:
    t = make_timing("llama-3.1-8b", "h100")
    p1, p8, p32 = (t.prefill_time(n) for n in (1024, 8192, 32768))
    assert p1 < p8 < p32
    assert p32 / p8 > 4.0  # attention grows quadratically with context
    # cached tokens are skipped
    assert t.prefill_time(8192, num_cached_tokens=4096) < p8 / 1.5


def test_decode_grows_with_kv_read() -> None:
    t = make_timing("llama-3.1-8b", "h100")
    assert t.decode_time(1, 1000) < t.decode_time(64, 64_000) < t.decode_time(256, 400_000)
    assert t.step_time(0, 0, 0, 0) == 0.0


def test_tensor_parallel_splits_work() -> None:
    t1 = make_timing("llama-3.1-8b", "h100", tp=1)
    t4 = make_timing("llama-3.1-8b", "h100", tp=4)
    assert t4.weight_bytes_per_rank == t1.weight_bytes_per_rank / 4
    assert t4.kv_bytes_per_token_per_rank == t1.kv_bytes_per_token / 4
    assert t4.kv_capacity_tokens > 3 * t1.kv_capacity_tokens
    assert t4.decode_time(1, 1024) < t1.decode_time(1, 1024) / 2  # all-reduce costs a bit
    assert t4.decode_time(1, 1024) > t1.decode_time(1, 1024) / 4
    # 70B needs tp
    with pytest.raises(ValueError, match="raise --tp"):
        make_timing("llama-3.1-70b", "h100", tp=1)
    assert make_timing("llama-3.1-70b", "h100", tp=4).kv_capacity_tokens > 100_000


def test_kv_transfer_time_from_link() -> None:
    t = make_timing("llama-3.1-8b", "h100")
    lk = t.link
    expected = lk.latency_s + 1000 * 131072 / (lk.bandwidth_bytes_per_s * lk.efficiency)
    assert t.kv_transfer_time(1000) == pytest.approx(expected)
    assert t.kv_transfer_time(0) == 0.0


def test_all_profiles_build() -> None:
    for m in MODELS:
        for g in GPUS:
            tp = {"llama-3.1-70b": 8, "qwen3-32b": 4}.get(m, 1)
            if tp > 1 and g == "cpu":
                continue
            s = TimingModel(get_model(m), get_gpu(g), tp=tp).summary()
            assert s["kv_capacity_tokens"] > 0 and s["decode_ms_per_token_batch1"] > 0
    tiny = get_model("tiny")
    assert (tiny.num_layers, tiny.hidden_size, tiny.vocab_size) == (2, 256, 4096)
    assert tiny.kv_bytes_per_token == 2 * 2 * 4 * 64 * 2


def test_unknown_names_list_valid_ones() -> None:
    with pytest.raises(KeyError, match=r"llama-3\.1-8b"):
        get_model("gpt-5")
    with pytest.raises(KeyError, match="h100"):
        get_gpu("tpu")


def _with_per_new_seq(gpu: str, cost: float) -> TimingModel:
    return TimingModel(
        get_model("llama-3.1-8b"), dataclasses.replace(get_gpu(gpu), per_new_seq_overhead_s=cost)
    )


def test_per_new_seq_overhead_is_additive_and_off_by_default() -> None:
    t = _with_per_new_seq("h100", 0.005)
    base = t.step_time(300, 3, 300 * 50.5, 300)
    assert t.step_time(300, 3, 300 * 50.5, 300, num_new_seqs=0) == base
    assert t.step_time(300, 3, 300 * 50.5, 300, num_new_seqs=2) == pytest.approx(base + 0.010)
    assert t.decode_time(4, 4000) == t.step_time(4, 4, 4004, 4000)  # decode admits no one
    # prefill_time charges it once, on the first chunk (8192-token chunks: 4 here)
    plain = make_timing("llama-3.1-8b", "h100")
    assert t.prefill_time(32768) == pytest.approx(plain.prefill_time(32768) + 0.005)


def test_gpu_profiles_have_no_per_new_seq_overhead() -> None:
    for name, gpu in GPUS.items():
        if name != "cpu":
            assert gpu.per_new_seq_overhead_s == 0.0, name
    assert get_gpu("cpu").per_new_seq_overhead_s > 0.0  # fitted (benchmarks/fidelity.py)


def test_calibration_facts_unchanged() -> None:
    """The per-request term leaves every calibrated figure exactly as committed."""
    committed = json.loads((REPO / "benchmarks/results/calibration.json").read_text())
    checks, summaries = run_checks()
    assert summaries == committed["profiles"]
    assert [c.measured for c in checks] == [c["measured"] for c in committed["checks"]]


def _drive(
    timing: TimingModel, prompts: list[int], max_tokens: int = 4, **cfg: Any
) -> tuple[float, int, int]:
    """Run requests of `prompts` lengths to completion, all added at t=0: total busy time,
    steps and preemptions."""
    config: dict[str, Any] = {"block_size": 16, "num_gpu_blocks": 2000, "vocab_size": 4096}
    config.update(cfg)
    core = EngineCore(EngineConfig(**config), timing)
    for i, n in enumerate(prompts):
        tokens = [100 + (i * 7 + k) % 3000 for k in range(n)]
        core.add_request(SimRequest(f"r{i}", tokens, max_tokens, ignore_eos=True), 0.0)
    now, busy, steps = 0.0, 0.0, 0
    while (t := core.next_step_time(now)) is not None:
        res = core.step(t)
        now, busy, steps = res.end, busy + res.duration_s, steps + 1
    return busy, steps, core.stats().num_preemptions


def test_core_charges_per_new_seq_overhead_once_per_request() -> None:
    cost = 0.004
    # chunked prefill (3 chunks of 1024 for the first request) and a second request admitted
    # in a later step: each request pays once, whatever its number of steps
    cfg: dict[str, Any] = {"max_num_batched_tokens": 1024}
    base, steps0, _ = _drive(make_timing("llama-3.1-8b", "h100"), [3000, 500], **cfg)
    charged, steps1, _ = _drive(_with_per_new_seq("h100", cost), [3000, 500], **cfg)
    assert steps1 == steps0 > 4
    assert charged == pytest.approx(base + 2 * cost)


def test_core_does_not_charge_resumed_requests_again() -> None:
    # 60 usable blocks of 16 (960 tokens): two 400-token requests decoding 300 tokens each
    # outgrow the pool, one is preempted and recomputed; only the two first admissions pay
    cost = 0.004
    cfg: dict[str, Any] = {"num_gpu_blocks": 61}
    base, steps0, pre0 = _drive(make_timing("llama-3.1-8b", "h100"), [400, 400], 300, **cfg)
    charged, steps1, pre1 = _drive(_with_per_new_seq("h100", cost), [400, 400], 300, **cfg)
    assert pre1 == pre0 >= 1
    assert steps1 == steps0
    assert charged == pytest.approx(base + 2 * cost)
