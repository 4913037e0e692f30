"""The per-replica performance model every planner sizes pools with.

Two questions, one per pool (DESIGN.md, "Autoscaling"):

- prefill: how many prompt tokens per second can one prefill replica sustain while a request
  of `isl_uncached_tokens` still gets its first token within `ttft_target_s`?
- decode: how many sequences of `context_tokens` can one decode replica hold while its step
  time (= the ITL each of them sees) stays within `itl_target_s`?

Implementations: from the simulator's timing model, from a profiled sweep file
(`pdorch profile --sweep`), and an online fit that corrects a prior from observed step times.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class PerfModel(ABC):
    """Per-replica capacity at a latency target (see module docstring)."""

    @abstractmethod
    def prefill_time_s(self, uncached_tokens: int) -> float:
        """Seconds one replica needs to prefill `uncached_tokens` alone."""

    @abstractmethod
    def prefill_tokens_per_s(self, isl_uncached_tokens: int, ttft_target_s: float) -> float:
        """Sustainable prompt tokens/s per replica keeping TTFT ≤ target (0 if unreachable)."""

    @abstractmethod
    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """One decode step of `batch` sequences of `context_tokens` each (= their ITL)."""

    @abstractmethod
    def decode_max_batch(self, context_tokens: int, itl_target_s: float) -> int:
        """Most sequences of `context_tokens` one replica holds with ITL ≤ target (KV-capped)."""

    def kv_usable_tokens(self) -> int | None:
        """KV tokens one decode replica may fill (None: the model does not say; the oracle's
        KV-in-flight term is then skipped)."""
        return None

    def decode_tokens_per_s(self, context_tokens: int, itl_target_s: float) -> float:
        """Output tokens/s per replica at the ITL target: batch / step time."""
        batch = self.decode_max_batch(context_tokens, itl_target_s)
        if batch <= 0:
            return 0.0
        return batch / self.decode_step_s(batch, context_tokens)
