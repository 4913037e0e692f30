"""`token_load` (prefill): when *this* request's prefill would finish on `r`, plus the decode
time it loses next to `r`'s decode batch.

The seeds' lesson: route by the **work left** on each replica, not by cache overlap alone;
overlap only shrinks the prefill part of that work. A step-time model of a chunked-prefill
engine (vLLM's scheduler): every step has a token budget `B` = `max_num_batched_tokens`; each
running decode takes one token of it, prefill chunks fill the rest; a step costs about
`tokens / tps` of compute plus `c · K` to read the decoding sequences' KV:

    W(r)        = prefill_tokens_queued(r) + uncached(r)
    uncached(r) = max(0, prompt_tokens - overlap_blocks(r) · block_size)
    K(r)        = decode_blocks(r) · block_size            KV tokens the decode batch reads
    n(r)        = requests_in_flight(r) if K(r) > 0 else 0    sequences sharing each step
    steps(r)    = max(1, ceil(W(r) / max(1, B - n(r))))
    prefill(r)  = (W(r) + steps(r) · n(r)) / tps(r) + steps(r) · c · K(r)
    decode(r)   = out · (n(r) / tps(r) + c · K(r))       out = min(max_tokens, expected_output)
    t(r)        = prefill(r) + decode(r)                  seconds; lower is better

On a pure prefill replica `K = n = 0`, so `t = W / tps` (explain reports `steps` 0: no
per-step term was charged). On a colocated replica the decode terms let a lighter replica win
over one holding more of the prompt when re-prefilling the missing part costs less than
decoding beside a heavy batch. `tps(r)` is the replica's profiled prefill tokens/s (full
chunks, so the per-step weight read is inside it), else `default_prefill_tokens_per_s`.
`c` = `decode_s_per_kv_token` = KV bytes per token / HBM bandwidth (Llama-3.1-8B bf16,
131,072 B/token, on an H100's 3.35 TB/s ≈ 3.9e-8 s; H200 ≈ 2.7e-8 s).

Parameters (defaults): `default_prefill_tokens_per_s` 10000, `max_num_batched_tokens` 8192
(vLLM's), `decode_s_per_kv_token` 4e-8, `expected_output_tokens` 256.

Example::

    scorers: [{name: token_load, params: {default_prefill_tokens_per_s: 12000}}]
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from router.plugins.base import Scorer, ScorerOutput
from router.plugins.registry import register
from router.replica_state import ReplicaSnapshot, RoutingRequest


class TokenLoadParams(BaseModel):
    """Parameters of the `token_load` scorer."""

    model_config = ConfigDict(extra="forbid")
    default_prefill_tokens_per_s: float = Field(default=10_000.0, gt=0.0)
    max_num_batched_tokens: int = Field(default=8192, ge=1)
    decode_s_per_kv_token: float = Field(default=4e-8, ge=0.0)
    expected_output_tokens: int = Field(default=256, ge=0)


@register
class TokenLoadScorer(Scorer[TokenLoadParams]):
    """Estimated prefill finish + decode slow-down, in seconds; lower wins."""

    name = "token_load"
    params_model = TokenLoadParams
    higher_is_better = False

    def score(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> ScorerOutput:
        params = self.params
        bs = request.block_size
        prompt = request.prompt_tokens
        default_tps = params.default_prefill_tokens_per_s
        budget_tokens = params.max_num_batched_tokens
        c = params.decode_s_per_kv_token
        out = params.expected_output_tokens
        if request.max_tokens is not None and request.max_tokens < out:
            out = request.max_tokens
        scores: dict[str, float] = {}
        terms: dict[str, dict[str, float]] = {}
        # One tight loop: this scorer sits on every prefill decision (benchmarks/router_bench).
        for r in candidates:
            uncached = prompt - r.overlap_blocks * bs
            if uncached < 0:
                uncached = 0
            work = r.prefill_tokens_queued + uncached
            tps = r.prefill_tokens_per_s or default_tps
            kv = r.decode_blocks * bs
            if kv > 0:
                n = r.requests_in_flight
                budget = budget_tokens - n if budget_tokens > n else 1
                steps = -(-work // budget) if work > budget else 1
                read = c * kv
                prefill = (work + steps * n) / tps + steps * read
                decode = out * (n / tps + read)
            else:
                n = steps = 0
                prefill = work / tps
                decode = 0.0
            rid = r.replica_id
            scores[rid] = prefill + decode
            terms[rid] = {
                "uncached_tokens": float(uncached),
                "queued_tokens": float(r.prefill_tokens_queued),
                "decode_kv_tokens": float(kv),
                "decode_seqs": float(n),
                "steps": float(steps),
                "prefill_s": prefill,
                "decode_s": decode,
                "tokens_per_s": tps,
            }
        return ScorerOutput(scores, terms)

    def describe(self, terms: dict[str, float]) -> str:
        return (
            f"prefill {terms['prefill_s'] * 1e3:.1f} ms ({terms['queued_tokens']:.0f} queued + "
            f"{terms['uncached_tokens']:.0f} uncached at {terms['tokens_per_s']:.0f} tok/s, "
            f"{terms['steps']:.0f} steps beside {terms['decode_seqs']:.0f} decodes / "
            f"{terms['decode_kv_tokens']:.0f} KV tokens) + decode slow-down "
            f"{terms['decode_s'] * 1e3:.1f} ms"
        )
