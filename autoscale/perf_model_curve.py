"""The capacity rules every per-replica performance model shares (`CurvePerfModel`).

Split from `autoscale/perf_model.py` (the sources and `build_perf_model` live there, the online
fit in `autoscale/perf_model_online.py`); behaviour unchanged.

Every model here answers the `PerfModel` questions from two per-replica curves, the prefill
time of one prompt alone `S(n)` and the decode step time `D(b, c)` of `b` sequences of `c`
context tokens each, plus the replica's limits (KV capacity, `max_num_seqs`). The rules that
turn the curves into capacity are shared (`CurvePerfModel`):

Prefill: tokens/s at a TTFT target (`prefill_tokens_per_s(n, target)`). A prefill replica is
modelled as one FIFO server (M/D/1): requests of `n` uncached tokens arrive Poisson at rate
lambda and each takes `S = S(n)`; utilisation `rho = lambda*S`. The waiting time's tail is
approximated as exponential with the M/D/1 mean (Pollaczek-Khinchine):

    P(W > 0) = rho,   E[W | W > 0] = S / (2(1 - rho)),
    w_q = S / (2(1 - rho)) * ln(rho / (1 - q))   if rho > 1 - q, else 0
    TTFT_q = S + w_q + t_transfer(n)

where `q` is the percentile (0.99) and `t_transfer` the KV transfer to the decode replica
(`include_transfer`, default on for the timing model; a sweep measured end-to-end TTFT, so
its `S` already contains what a live engine adds). `rho*` is the largest `rho ≤ rho_max`
(default 0.9, burst headroom) with `TTFT_q ≤ target`, found by bisection (`TTFT_q` rises
monotonically in rho); the answer is `rho* · n / S` tokens/s, 0 when `S + t_transfer` alone
exceeds the target. Serving prefills one at a time is conservative: vLLM packs several short
prompts into one `max_num_batched_tokens` step.

Decode: sequences at an ITL target (`decode_max_batch(c, target)`): the largest `b` with
`D(b, c) ≤ target` (bisection; `D` rises in `b`), capped by `max_num_seqs` and by the KV pool:
`b · ceil(c / block_size) ≤ kv_usage_max · (num_gpu_blocks - 1)` (vLLM's null block is not
"""

from __future__ import annotations

import math
from abc import abstractmethod

from autoscale.perf_model_base import PerfModel

DEFAULT_RHO_MAX = 0.9
DEFAULT_PERCENTILE = 99.0


def ttft_at_percentile(service_s: float, rho: float, q: float) -> float:
    """`S + w_q` of the module docstring: the q-quantile (0 < q < 1) of wait + service."""
    if rho <= 0:
        return service_s
    if rho >= 1:
        return math.inf
    if rho <= 1 - q:
        return service_s
    return service_s + service_s / (2 * (1 - rho)) * math.log(rho / (1 - q))


def max_utilisation(
    service_s: float, budget_s: float, q: float, rho_max: float = DEFAULT_RHO_MAX
) -> float:
    """Largest rho ≤ rho_max with `ttft_at_percentile(S, rho, q) ≤ budget_s` (0 if none)."""
    if service_s <= 0 or service_s > budget_s:
        return 0.0
    if ttft_at_percentile(service_s, rho_max, q) <= budget_s:
        return rho_max
    lo, hi = 0.0, rho_max
    for _ in range(60):
        mid = (lo + hi) / 2
        if ttft_at_percentile(service_s, mid, q) <= budget_s:
            lo = mid
        else:
            hi = mid
    return lo


class CurvePerfModel(PerfModel):
    """The capacity rules over `prefill_time_s` and `decode_step_s` (module docstring).

    `percentile` is the TTFT tail the prefill rule keeps (default 99), `rho_max` the prefill
    utilisation cap, `kv_usage_max` the share of the KV pool decode may fill (default 1.0)."""

    def __init__(
        self,
        *,
        kv_capacity_tokens: int,
        max_num_seqs: int,
        block_size: int = 16,
        percentile: float = DEFAULT_PERCENTILE,
        rho_max: float = DEFAULT_RHO_MAX,
        kv_usage_max: float = 1.0,
    ) -> None:
        if not 0 < percentile < 100:
            raise ValueError(f"percentile must be in (0, 100), got {percentile}")
        if not 0 < rho_max < 1:
            raise ValueError(f"rho_max must be in (0, 1), got {rho_max}")
        self.kv_capacity_tokens = kv_capacity_tokens
        self.max_num_seqs = max_num_seqs
        self.block_size = block_size
        self.percentile = percentile
        self.rho_max = rho_max
        self.kv_usage_max = kv_usage_max

    def transfer_s(self, uncached_tokens: int) -> float:
        """Time TTFT spends outside the prefill replica's queue and step (default 0)."""
        return 0.0

    @abstractmethod
    def prefill_time_s(self, uncached_tokens: int) -> float: ...

    @abstractmethod
    def decode_step_s(self, batch: int, context_tokens: int) -> float: ...

    def prefill_utilisation(self, isl_uncached_tokens: int, ttft_target_s: float) -> float:
        """rho* of the module docstring."""
        n = max(1, isl_uncached_tokens)
        service = self.prefill_time_s(n)
        budget = ttft_target_s - self.transfer_s(n)
        return max_utilisation(service, budget, self.percentile / 100.0, self.rho_max)

    def prefill_tokens_per_s(self, isl_uncached_tokens: int, ttft_target_s: float) -> float:
        n = max(1, isl_uncached_tokens)
        rho = self.prefill_utilisation(n, ttft_target_s)
        return rho * n / self.prefill_time_s(n) if rho > 0 else 0.0

    def estimated_ttft_s(
        self,
        uncached_tokens: int,
        queued_prefill_tokens: int = 0,
        mean_queued_isl_tokens: int | None = None,
    ) -> float:
        """TTFT of a request of `uncached_tokens` arriving at a replica with
        `queued_prefill_tokens` ahead of it: the queue drains as prompts of
        `mean_queued_isl_tokens` (default: this one's size), `q/m · S(m)`, then its own
        `S(n)` and the transfer. The per-replica signal of a reactive (load-mode) step."""
        n = max(1, uncached_tokens)
        wait = 0.0
        if queued_prefill_tokens > 0:
            m = max(1, mean_queued_isl_tokens or n)
            wait = queued_prefill_tokens / m * self.prefill_time_s(m)
        return wait + self.prefill_time_s(n) + self.transfer_s(n)

    def kv_usable_blocks(self) -> int:
        """KV blocks decode may fill: `kv_usage_max` of the pool, the null block excluded."""
        return int(self.kv_usage_max * (self.kv_capacity_tokens // self.block_size - 1))

    def kv_usable_tokens(self) -> int:
        return self.kv_usable_blocks() * self.block_size

    def kv_max_batch(self, context_tokens: int) -> int:
        """Sequences of `context_tokens` the KV pool holds (block-rounded, null block excluded)."""
        blocks_per_seq = max(1, math.ceil(context_tokens / self.block_size))
        return max(0, self.kv_usable_blocks() // blocks_per_seq)

    def decode_max_batch(self, context_tokens: int, itl_target_s: float) -> int:
        cap = min(self.max_num_seqs, self.kv_max_batch(context_tokens))
        if cap < 1 or self.decode_step_s(1, context_tokens) > itl_target_s:
            return 0
        if self.decode_step_s(cap, context_tokens) <= itl_target_s:
            return cap
        lo, hi = 1, cap  # step(lo) ≤ target < step(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.decode_step_s(mid, context_tokens) <= itl_target_s:
                lo = mid
            else:
                hi = mid
        return lo
