"""The simulated engine's timing model: how long one engine step takes on a given GPU.

A roofline per step. For one step of the engine, with (per tensor-parallel rank)

    T      tokens scheduled (prefill chunks + one per decoding sequence)
    S      sequences scheduled (each samples one token: lm_head runs S times)
    N      sequences scheduled for the first time in their life (`num_new_seqs`; 0 in a
           fast-forwarded decode stretch, preempted requests resuming do not count again)
    A      Σ_i n_i·(c_i + (n_i + 1)/2)   attention token·context product: sequence i computes
           n_i new tokens on top of c_i already-computed ones (causal)
    R      Σ_i (c_i + n_i)               KV tokens the step reads

    flops   = [2·P_mm·T + 2·V·h·S + 4·L·H·d·A] / tp
    bytes   = W/tp + R·kv_per_token_per_rank
    compute = flops / (peak_flops · mfu)
    memory  = bytes / (hbm_bytes_per_s · hbm_efficiency)
    allreduce = 0 if tp == 1 else 2·L·[allreduce_latency + 2(tp-1)/tp · T·h·dtype / tp_link]
    step    = step_overhead + per_seq·S + per_token·T + per_new_seq·N
              + max(compute, memory) + allreduce

`per_new_seq` (`GpuProfile.per_new_seq_overhead_s`) is a once-per-request cost outside the
roofline: the part of a request's TTFT that vLLM charges before/around its first step (input
processing after `arrival_time`, IPC to the engine core, admission, adding it to the model
runner's input batch, and the front end picking the first output up: vLLM's
`vllm:time_to_first_token_seconds` runs from the API server's `arrival_time` to the API
server's output-handler clock, while its ITL uses engine-core timestamps). It sits in the step
so that a request's TTFT includes it; requests sharing that step see it too. 0 on the GPU
profiles (no measurement to fit it from), fitted on `cpu`.

P_mm = parameters every token multiplies through (no embedding, no lm_head), V = vocab,
h = hidden, L = layers, H = query heads, d = head_dim, W = weight bytes. Prefill is
compute-bound (the linear term 2·P·T plus the attention term quadratic in context), decode is
bandwidth-bound (weights once per step plus every running sequence's KV), and a mixed step is
whichever bound binds, as on real hardware.

KV pool ("following vLLM's memory accounting", per GPU):

    kv_memory = gpu_memory_utilization · memory - W/tp - activations - non_torch
    activations = B·(4·h + 2·I/tp)·dtype + max_num_seqs·V·4      (profile-run peak: B =
                  max_num_batched_tokens hidden/MLP activations + fp32 sampler logits)

unless `kv_memory_gb` (GiB per GPU, like vLLM's `kv_cache_memory_bytes`) or the GPU profile's
fixed `default_kv_memory_gib` (vllm-cpu) gives it. Capacity = kv_memory / kv_per_token_per_rank,
where a rank holds max(1, K/tp) KV heads (replicated when tp > K).

KV transfer between replicas: `link.latency + tokens·kv_per_token_per_rank / (link.bw · eff)`
(each TP rank moves its own shard in parallel).

Defaults (`gpu_memory_utilization` 0.9, `max_num_batched_tokens` 8192, `max_num_seqs` 256) are
vLLM's. Calibration (8B bf16 H100): see `benchmarks/calibration.py` and
`benchmarks/results/calibration.md`.
"""

from __future__ import annotations

from typing import Any

from pools.sim.profiles import GIB, GpuProfile, LinkProfile, ModelProfile, get_link

PROFILE_PREFILL_LENGTHS = (1024, 8192, 32768)
DECODE_BATCH1_CONTEXT = 1024


class TimingModel:
    """Step times, KV capacity and transfer times for one replica (model x GPU x tp)."""

    def __init__(
        self,
        model: ModelProfile,
        gpu: GpuProfile,
        tp: int = 1,
        kv_memory_gb: float | None = None,
        gpu_memory_utilization: float = 0.9,
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 256,
        link: LinkProfile | None = None,
    ) -> None:
        if tp < 1:
            raise ValueError(f"tp must be >= 1, got {tp}")
        if kv_memory_gb is not None and kv_memory_gb <= 0:
            raise ValueError(f"kv_memory_gb must be > 0, got {kv_memory_gb}")
        self.model = model
        self.gpu = gpu
        self.tp = tp
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.link = link if link is not None else get_link(gpu.default_link)

        m = model
        self.kv_heads_per_rank = max(1, m.num_kv_heads // tp)
        self.kv_bytes_per_token = m.kv_bytes_per_token
        self.kv_bytes_per_token_per_rank = (
            2 * m.num_layers * self.kv_heads_per_rank * m.head_dim * m.dtype_bytes
        )
        self.weight_bytes_per_rank = m.weight_bytes / tp
        if kv_memory_gb is not None:
            self.kv_memory_bytes = kv_memory_gb * GIB
        elif gpu.default_kv_memory_gib is not None:
            self.kv_memory_bytes = gpu.default_kv_memory_gib * GIB
        else:
            self.kv_memory_bytes = (
                gpu_memory_utilization * gpu.memory_bytes
                - self.weight_bytes_per_rank
                - self.activation_bytes_per_rank
                - gpu.non_torch_memory_gib * GIB
            )
        if self.kv_memory_bytes <= 0:
            raise ValueError(
                f"{m.name} does not fit on {gpu.name} with tp={tp}: no memory left for the KV "
                f"cache (weights {self.weight_bytes_per_rank / GIB:.1f} GiB per GPU); raise --tp"
            )
        self.kv_capacity_tokens = int(self.kv_memory_bytes // self.kv_bytes_per_token_per_rank)

        # Per-step coefficients, precomputed so step_time is a handful of float ops.
        peak = gpu.peak_flops * gpu.mfu
        self._s_per_token_linear = 2.0 * m.num_matmul_params_per_token / tp / peak
        self._s_per_seq_lm_head = 2.0 * m.vocab_size * m.hidden_size / tp / peak
        self._s_per_attn = 4.0 * m.num_layers * m.num_heads * m.head_dim / tp / peak
        bw = gpu.hbm_bytes_per_s * gpu.hbm_efficiency
        self._s_weights = self.weight_bytes_per_rank / bw
        self._s_per_kv_token = self.kv_bytes_per_token_per_rank / bw
        if tp > 1:
            self._s_allreduce_fixed = 2 * m.num_layers * gpu.allreduce_latency_s
            self._s_allreduce_per_token = (
                2
                * m.num_layers
                * (2 * (tp - 1) / tp)
                * m.hidden_size
                * m.dtype_bytes
                / gpu.tp_link_bytes_per_s
            )
        else:
            self._s_allreduce_fixed = 0.0
            self._s_allreduce_per_token = 0.0

    @property
    def activation_bytes_per_rank(self) -> float:
        """Profile-run activation peak (see the module docstring)."""
        m = self.model
        hidden = self.max_num_batched_tokens * (
            4 * m.hidden_size + 2 * m.intermediate_size / self.tp
        )
        return hidden * m.dtype_bytes + self.max_num_seqs * m.vocab_size * 4

    @property
    def decode_s_per_kv_token(self) -> float:
        """Seconds one decode step spends reading one KV token (`kv_per_token_per_rank / (hbm ·
        efficiency)`: the memory term's slope): the routers' per-replica KV-read cost."""
        return self._s_per_kv_token

    def num_gpu_blocks(self, block_size: int) -> int:
        """vLLM's `num_gpu_blocks` for this pool (includes the null block, as vLLM counts it)."""
        return max(2, self.kv_capacity_tokens // block_size)

    # -- the core's per-step call ---------------------------------------------------------
    def step_time(
        self,
        num_tokens: int,
        num_seqs: int,
        attn_ctx_tokens: float,
        kv_read_tokens: int,
        *,
        num_new_seqs: int = 0,
    ) -> float:
        """Seconds for one step; see the module docstring for T, S, N, A, R and the formula.
        `num_new_seqs` (N) counts the scheduled sequences this step schedules for the first
        time; the default 0 charges no per-request cost."""
        if num_tokens <= 0:
            return 0.0
        g = self.gpu
        compute = (
            self._s_per_token_linear * num_tokens
            + self._s_per_seq_lm_head * num_seqs
            + self._s_per_attn * attn_ctx_tokens
        )
        memory = self._s_weights + self._s_per_kv_token * kv_read_tokens
        return (
            g.step_overhead_s
            + g.per_seq_overhead_s * num_seqs
            + g.per_token_overhead_s * num_tokens
            + g.per_new_seq_overhead_s * num_new_seqs
            + (compute if compute > memory else memory)
            + self._s_allreduce_fixed
            + self._s_allreduce_per_token * num_tokens
        )

    # -- derived figures (profile CLI, calibration, planners) -----------------------------
    def prefill_time(self, num_tokens: int, num_cached_tokens: int = 0) -> float:
        """Time to prefill one new prompt alone, in chunks of `max_num_batched_tokens` as the
        engine does; `num_cached_tokens` already in the prefix cache are skipped (but attended
        to). The first chunk carries the per-request cost (`per_new_seq_overhead_s`)."""
        total = 0.0
        done = num_cached_tokens
        new = 1
        while done < num_tokens:
            n = min(self.max_num_batched_tokens, num_tokens - done)
            total += self.step_time(n, 1, n * (done + (n + 1) / 2), done + n, num_new_seqs=new)
            done += n
            new = 0
        return total

    def decode_time(self, batch: int, context_tokens_total: int) -> float:
        """One decode step (= time per output token) for `batch` sequences holding
        `context_tokens_total` KV tokens between them."""
        return self.step_time(batch, batch, context_tokens_total + batch, context_tokens_total)

    def decode_time_full_pool(self) -> float:
        """A decode step with the whole KV pool in use by min(max_num_seqs, capacity) sequences."""
        batch = max(1, min(self.max_num_seqs, self.kv_capacity_tokens))
        return self.decode_time(batch, self.kv_capacity_tokens)

    def kv_transfer_time(self, num_tokens: int) -> float:
        """Seconds to move `num_tokens` tokens of KV from a prefill to a decode replica."""
        if num_tokens <= 0:
            return 0.0
        lk = self.link
        nbytes = num_tokens * self.kv_bytes_per_token_per_rank
        return lk.latency_s + nbytes / (lk.bandwidth_bytes_per_s * lk.efficiency)

    def summary(self) -> dict[str, Any]:
        """What `pdorch profile --json` prints (times in ms)."""
        return {
            "model": self.model.name,
            "gpu": self.gpu.name,
            "tp": self.tp,
            "num_params": self.model.num_params,
            "weight_bytes_per_gpu": int(self.weight_bytes_per_rank),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_rank,
            "kv_memory_bytes_per_gpu": int(self.kv_memory_bytes),
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "prefill_ms": {
                str(n): round(self.prefill_time(n) * 1e3, 3) for n in PROFILE_PREFILL_LENGTHS
            },
            "decode_ms_per_token_batch1": round(
                self.decode_time(1, DECODE_BATCH1_CONTEXT) * 1e3, 3
            ),
            "decode_ms_per_token_full_pool": round(self.decode_time_full_pool() * 1e3, 3),
            "full_pool_batch": max(1, min(self.max_num_seqs, self.kv_capacity_tokens)),
            "kv_transfer_ms_per_1k_tokens": round(self.kv_transfer_time(1024) * 1e3, 4),
            "link": self.link.name,
        }


def make_timing(
    model: str,
    gpu: str,
    tp: int = 1,
    kv_memory_gb: float | None = None,
    **kwargs: Any,
) -> TimingModel:
    """A TimingModel from profile names (KeyError lists the valid names)."""
    from pools.sim.profiles import get_gpu, get_model

    return TimingModel(get_model(model), get_gpu(gpu), tp=tp, kv_memory_gb=kv_memory_gb, **kwargs)
