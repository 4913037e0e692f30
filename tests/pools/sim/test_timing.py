"""Timing model: calibration facts within 15%, and the shape of the formulas."""

from __future__ import annotations

import pytest

from pools.sim.profiles import GPUS, MODELS, get_gpu, get_model
from pools.sim.timing import TimingModel, make_timing

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
