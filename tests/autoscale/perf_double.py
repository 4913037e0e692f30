"""An analytic `PerfModel` test double with numbers easy to check by hand.

prefill: `t(u) = u / prefill_tps`; capacity at a TTFT target = `prefill_tps · prefill_util`
while `t(u) ≤ target`, else 0. decode: `step(b) = step_base_s + step_per_seq_s · b`;
max batch at an ITL target = `floor((target - base) / per_seq)`, capped by `kv_tokens / ctx`;
`kv_usable_tokens` = `kv_tokens`.
"""

from __future__ import annotations

import math

from autoscale.perf_model_base import PerfModel


class LinearPerfModel(PerfModel):
    def __init__(
        self,
        prefill_tps: float = 10_000.0,
        prefill_util: float = 0.8,
        step_base_s: float = 0.01,
        step_per_seq_s: float = 0.0004,
        kv_tokens: int = 10**9,
    ) -> None:
        self.prefill_tps = prefill_tps
        self.prefill_util = prefill_util
        self.step_base_s = step_base_s
        self.step_per_seq_s = step_per_seq_s
        self.kv_tokens = kv_tokens

    def prefill_time_s(self, uncached_tokens: int) -> float:
        return uncached_tokens / self.prefill_tps

    def prefill_tokens_per_s(self, isl_uncached_tokens: int, ttft_target_s: float) -> float:
        if self.prefill_time_s(isl_uncached_tokens) > ttft_target_s:
            return 0.0
        return self.prefill_tps * self.prefill_util

    def kv_usable_tokens(self) -> int | None:  # a subclass may not say (None)
        return self.kv_tokens

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        return self.step_base_s + self.step_per_seq_s * batch

    def decode_max_batch(self, context_tokens: int, itl_target_s: float) -> int:
        by_itl = math.floor((itl_target_s - self.step_base_s) / self.step_per_seq_s + 1e-9)
        return max(0, min(by_itl, self.kv_tokens // max(1, context_tokens)))
