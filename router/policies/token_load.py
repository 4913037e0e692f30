"""`token_load` (prefill) and `token_load_decode`: pdorch's own policies.

The seeds' lesson: route by the **work left** on each replica, not by cache overlap alone.
Overlap is a means to estimate the prefill part of that work.

**Prefill** (`token_load`). Formula: the estimated time until *this* request's prefill
finishes on `r`, plus the decode time it loses to `r`'s decode batch afterwards. It rests on a
step-time model of a chunked-prefill engine (vLLM's scheduler): every step has a token budget
`B` = `max_num_batched_tokens`; each running decode sequence takes one token of it, prefill
chunks fill the rest; a step costs about `tokens / tps` of compute plus `c * K` to read the KV
of the decoding sequences (decode is bandwidth-bound: the reads grow with their context):

    step(r)     ≈ tokens(r) / tps(r) + c * K(r)          (its weight read is inside 1/tps)
    W(r)        = prefill_tokens_queued(r) + uncached(r)
    uncached(r) = max(0, prompt_tokens - overlap_blocks(r) * block_size)
    K(r)        = decode_blocks(r) * block_size           KV tokens the decode batch reads
    n(r)        = requests_in_flight(r) if K(r) > 0 else 0   sequences sharing each step
    steps(r)    = max(1, ceil(W(r) / max(1, B - n(r))))
    prefill(r)  = (W(r) + steps(r) * n(r)) / tps(r) + steps(r) * c * K(r)
    decode(r)   = out * (n(r) / tps(r) + c * K(r))
    t(r)        = prefill(r) + decode(r)

`prefill(r)` is when the last chunk of this prompt completes (FCFS behind the queued prefill,
every step shared with the `n(r)` decoding sequences). `decode(r)` is this request's own
slow-down while it decodes `out = min(max_tokens, expected_output_tokens)` tokens (or
`expected_output_tokens`) next to `r`'s decode batch: each of its steps computes `n(r)` other
tokens and reads `K(r)` other KV tokens, compared with an idle replica (the request's own
context costs the same everywhere and is left out). `n(r)` counts the requests this router
has in flight there (those still prefilling too: a slight over-count). On a pure prefill
replica `K = n = 0`, so `t(r) = W(r) / tps(r)`: the decode terms have no effect there
(explain reports `steps` 0: no per-step term was charged). On a
colocated replica they let a lighter replica win over one holding more of the prompt when
re-prefilling the missing part costs less than decoding next to a heavy batch.

`tps(r)` = the replica's profiled prefill tokens/s (full `B`-token chunks, so the per-step
weight read is included), else `default_prefill_tokens_per_s`. `c` =
`decode_s_per_kv_token`: KV bytes per token / HBM bandwidth, e.g. Llama-3.1-8B bf16
(131,072 B/token) on an H100 (3.35 TB/s) ≈ 3.9e-8 s; H200 (4.8 TB/s) ≈ 2.7e-8 s.
Lowest `t` wins; ties to more overlap, then the lowest replica id.

Parameters (defaults): `default_prefill_tokens_per_s` 10000, `max_num_batched_tokens` 8192
(vLLM's default), `decode_s_per_kv_token` 4e-8 (8B bf16, H100), `expected_output_tokens` 256.

**Decode** (`token_load_decode`): token load plus KV headroom. With
`need = ceil((prompt_tokens + expected_out) / block_size)` blocks the request will grow into
(`expected_out = min(max_tokens, expected_output_tokens)`, or `expected_output_tokens`),

    used(r)     = max(decode_blocks(r), ceil(kv_usage(r) * capacity(r)))
    pending(r)  = ceil(prefill_tokens_queued(r) / block_size)
    headroom(r) = floor(capacity(r) * (1 - kv_headroom_margin)) - used(r) - pending(r)
    load(r)     = (used(r) + prefill_weight * pending(r) + need) / capacity(r)

A replica with `headroom(r) < need` is rejected (it would queue or preempt). The lowest `load`
among the rest wins (ties to the lowest replica id). If every healthy replica is rejected, the
lowest `load` wins anyway and the reason says so (the coordinator may queue instead). When any
candidate's capacity is unknown (0), `load` is compared in blocks (no division) and no replica
is rejected for headroom.

Parameters (defaults): `expected_output_tokens` 256, `kv_headroom_margin` 0.0,
`prefill_weight` 1.0.

Example YAML::

    prefill: {name: token_load, params: {default_prefill_tokens_per_s: 12000}}
    decode: {name: token_load_decode, params: {expected_output_tokens: 512}}
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from router.policies.base import Policy, healthy_only
from router.policies.registry import register
from router.replica_state import PolicyDecision, ReplicaSnapshot, RoutingRequest


class TokenLoadParams(BaseModel):
    """Parameters of the prefill `token_load` policy."""

    model_config = ConfigDict(extra="forbid")
    default_prefill_tokens_per_s: float = Field(default=10_000.0, gt=0.0)
    max_num_batched_tokens: int = Field(default=8192, ge=1)
    decode_s_per_kv_token: float = Field(default=4e-8, ge=0.0)
    expected_output_tokens: int = Field(default=256, ge=0)


class TokenLoadDecodeParams(BaseModel):
    """Parameters of the `token_load_decode` policy."""

    model_config = ConfigDict(extra="forbid")
    expected_output_tokens: int = Field(default=256, ge=0)
    kv_headroom_margin: float = Field(default=0.0, ge=0.0, lt=1.0)
    prefill_weight: float = Field(default=1.0, ge=0.0)


@register("prefill_token_load")
class TokenLoadPolicy(Policy[TokenLoadParams]):
    """Prefill: earliest estimated finish of this request's prefill (+ decode slow-down)."""

    name = "token_load"
    params_model = TokenLoadParams

    def pick(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> PolicyDecision:
        params = self.params
        healthy, rejected = healthy_only(replicas)
        if not healthy:
            return self._no_healthy(replicas)
        bs = request.block_size
        prompt = request.prompt_tokens
        default_tps = params.default_prefill_tokens_per_s
        budget_tokens = params.max_num_batched_tokens
        c = params.decode_s_per_kv_token
        out = params.expected_output_tokens
        if request.max_tokens is not None and request.max_tokens < out:
            out = request.max_tokens
        scores: dict[str, float] = {}
        details: dict[str, dict[str, float]] = {}
        best: tuple[float, int, str] | None = None
        for r in healthy:
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
            t = prefill + decode
            rid = r.replica_id
            scores[rid] = t
            details[rid] = {
                "uncached_tokens": float(uncached),
                "queued_tokens": float(r.prefill_tokens_queued),
                "decode_kv_tokens": float(kv),
                "decode_seqs": float(n),
                "steps": float(steps),
                "prefill_s": prefill,
                "decode_s": decode,
                "tokens_per_s": tps,
            }
            key = (t, -r.overlap_blocks, rid)
            if best is None or key < best:
                best = key
        assert best is not None
        chosen = best[2]
        d = details[chosen]
        return PolicyDecision(
            policy=self.name,
            chosen=chosen,
            reason=(
                f"earliest finish {scores[chosen] * 1e3:.1f} ms = prefill "
                f"{d['prefill_s'] * 1e3:.1f} ms ({d['queued_tokens']:.0f} queued + "
                f"{d['uncached_tokens']:.0f} uncached at {d['tokens_per_s']:.0f} tok/s, "
                f"{d['steps']:.0f} steps beside {d['decode_seqs']:.0f} decodes / "
                f"{d['decode_kv_tokens']:.0f} KV tokens) + decode slow-down "
                f"{d['decode_s'] * 1e3:.1f} ms"
            ),
            scores=scores,
            higher_is_better=False,
            details=details,
            rejected=rejected,
        )


def decode_need_blocks(request: RoutingRequest, expected_output_tokens: int) -> int:
    """Blocks the request is expected to occupy on its decode replica."""
    out = expected_output_tokens
    if request.max_tokens is not None:
        out = min(request.max_tokens, expected_output_tokens)
    return math.ceil((request.prompt_tokens + out) / max(1, request.block_size))


@register("decode_token_load")
class TokenLoadDecodePolicy(Policy[TokenLoadDecodeParams]):
    """Decode: least projected KV load among replicas with headroom for the request."""

    name = "token_load_decode"
    params_model = TokenLoadDecodeParams

    def pick(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
    ) -> PolicyDecision:
        params = self.params
        healthy, rejected = healthy_only(replicas)
        if not healthy:
            return self._no_healthy(replicas)
        bs = max(1, request.block_size)
        need = decode_need_blocks(request, params.expected_output_tokens)
        capacity_known = all(r.kv_capacity_blocks > 0 for r in healthy)
        scores: dict[str, float] = {}
        details: dict[str, dict[str, float]] = {}
        fits: list[str] = []
        no_room: dict[str, str] = {}
        for r in healthy:
            rid = r.replica_id
            used = max(r.decode_blocks, math.ceil(r.kv_usage * r.kv_capacity_blocks - 1e-9))
            pending = math.ceil(r.prefill_tokens_queued / bs)
            projected = used + params.prefill_weight * pending + need
            if capacity_known:
                usable = math.floor(r.kv_capacity_blocks * (1.0 - params.kv_headroom_margin))
                headroom = usable - used - pending
                scores[rid] = projected / r.kv_capacity_blocks
                if headroom < need:
                    no_room[rid] = f"kv headroom {headroom} blocks < need {need}"
                else:
                    fits.append(rid)
            else:
                headroom = -1
                scores[rid] = projected
                fits.append(rid)
            details[rid] = {
                "used_blocks": float(used),
                "pending_prefill_blocks": float(pending),
                "need_blocks": float(need),
                "headroom_blocks": float(headroom),
            }
        pool = fits or list(scores)
        chosen = min(pool, key=lambda rid: (scores[rid], rid))
        unit = "of KV" if capacity_known else "blocks"
        if fits:
            rejected.update(no_room)
            reason = f"least projected load {scores[chosen]:.3f} {unit} with headroom for {need}"
        else:
            reason = (
                f"no replica has KV headroom for {need} blocks: least projected load "
                f"{scores[chosen]:.3f} {unit} chosen anyway"
            )
        return PolicyDecision(
            policy=self.name,
            chosen=chosen,
            reason=reason,
            scores=scores,
            higher_is_better=False,
            details=details,
            rejected=rejected,
        )
