"""`token_load` (prefill) and `token_load_decode`: pdorch's own policies.

The seeds' lesson: route by the **work left** on each replica, not by cache overlap alone.
Overlap is a means to estimate the prefill part of that work.

**Prefill** (`token_load`). Formula: the estimated time until *this* request's prefill
finishes on `r`:

    uncached(r)      = max(0, prompt_tokens - overlap_blocks(r) * block_size)
    interference(r)  = decode_interference * decode_blocks(r) * block_size
    t(r)             = (prefill_tokens_queued(r) + uncached(r) + interference(r)) / tps(r)

`prefill_tokens_queued` is the uncached prefill admitted to `r` and not yet done
(`router/token_load.py`); `tps(r)` the replica's profiled prefill tokens/s, else
`default_prefill_tokens_per_s`. The decode-interference term charges a replica that is also
decoding: each scheduler step shares its token budget and its time with the running decode
sequences, whose attention reads grow with their context; `decode_interference` is the prefill
token-equivalents one token of active decode context costs (0 on a pure prefill replica, whose
decode_blocks stay 0). Lowest `t` wins; ties to more overlap, then the lowest replica id.

Parameters (defaults): `default_prefill_tokens_per_s` 10000, `decode_interference` 0.02.

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
    decode_interference: float = Field(default=0.02, ge=0.0)


class TokenLoadDecodeParams(BaseModel):
    """Parameters of the `token_load_decode` policy."""

    model_config = ConfigDict(extra="forbid")
    expected_output_tokens: int = Field(default=256, ge=0)
    kv_headroom_margin: float = Field(default=0.0, ge=0.0, lt=1.0)
    prefill_weight: float = Field(default=1.0, ge=0.0)


@register("prefill_token_load")
class TokenLoadPolicy(Policy[TokenLoadParams]):
    """Prefill: earliest estimated finish of this request's prefill."""

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
        beta = params.decode_interference * bs
        scores: dict[str, float] = {}
        details: dict[str, dict[str, float]] = {}
        best: tuple[float, int, str] | None = None
        for r in healthy:
            uncached = prompt - r.overlap_blocks * bs
            if uncached < 0:
                uncached = 0
            interference = beta * r.decode_blocks
            tps = r.prefill_tokens_per_s or default_tps
            t = (r.prefill_tokens_queued + uncached + interference) / tps
            rid = r.replica_id
            scores[rid] = t
            details[rid] = {
                "uncached_tokens": float(uncached),
                "queued_tokens": float(r.prefill_tokens_queued),
                "interference_tokens": interference,
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
                f"earliest prefill finish {scores[chosen] * 1e3:.1f} ms = ("
                f"{d['queued_tokens']:.0f} queued + {d['uncached_tokens']:.0f} uncached + "
                f"{d['interference_tokens']:.0f} decode) / {d['tokens_per_s']:.0f} tok/s"
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
