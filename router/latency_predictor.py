"""A learnt latency predictor per replica: online calibration of the `token_load` model from
what the request lifecycle already observes (issue 15; llm-d ships a latency-predictor scorer
fed by observed TTFT/TPOT, this is pdorch's own, far smaller one).

Two fits per replica, each a line through the model's own estimate `x` of the same quantity:

    prefill   y = observed seconds from admission to the end of the request's prefill
                  (P/D: the prefill leg's return; local/colocated: the first token)
              x = prior_prefill_s(W, n, K, tps, c, B) at admission on that replica
                  (W = queued prefill tokens + the request's uncached tokens; n, K the decode
                  sequences and KV tokens there; `token_load`'s formula, below)
    decode    y = observed mean seconds per output token after the first
                  ((t_finish - t_first) / (generated - 1), requests with >= 2 tokens)
              x = n / tps + c · K on the decode replica at its first token (token load)

    fit       y ≈ a + k · x, weighted ridge least squares toward the prior θ₀ = (a, k) = (0, 1),
              in units of a reference time `ref` (x and y divided by it):
                  θ = (Λ + Σ_k w_k z_k z_kᵀ)⁻¹ (Λ·θ₀ + Σ_k w_k z_k y_k),  z_k = (1, x_k)
              w_k = 2^(-(now - t_k) / half_life_s)         older observations fade
              Λ = diag(h, 1) · prior_weight: the prior never fades, so a replica seen
              rarely stays near the model instead of following one noisy observation.
              h = 1 for prefill: the model prices all of a prefill but a small per-request
              overhead, so a replica that is slower is explained by the ratio (the
              extrapolation a slower or throttled GPU needs), not by an intercept;
              h = 0.01 for decode: the model's term is the batch's slow-down only, the base
              step (weights read, ~4 ms for 8B on H200) is a large intercept it lacks

With no observation the estimate is exactly the model (a = 0, k = 1), so the scorer that reads
it (`latency_predictor`, router/plugins/scorers/latency_predictor.py) starts as `token_load`.
A replica that runs 2x slower than its profile says has every y ≈ 2x: k → 2 within a few
observations (the ridge weighs `prior_weight` pseudo-observations of x_ref seconds against the
real ones; tests/router/test_latency_predictor.py). The intercept takes what the model lacks per
request (HTTP, scheduling, the per-request overhead), k what it mis-scales (a slower GPU, a
throttled one, a wrong tokens/s, interference the formula does not see).

`prior_prefill_s` is `token_load`'s prefill term (router/plugins/scorers/token_load.py):

    steps = max(1, ceil(W / max(1, B - n)))   if K > 0 else 0
    prior = (W + steps · n) / tps + steps · c · K

Parameters (`LatencyFitParams`, defaults): `half_life_s` 60 (virtual or real seconds, `now`
injected), `prior_weight` 2.0 (pseudo-observations), `prefill_ref_s` 0.5 and `decode_ref_s`
0.002 (the x scale at which one pseudo-observation weighs like one real one),
`min_ratio` 0.1 / `max_ratio` 10 (clamp of k: a burst of outliers must not make a replica look
free or dead), `default_prefill_tokens_per_s` 10000, `decode_s_per_kv_token` 4e-8 and
`max_num_batched_tokens` 8192 (for replicas without profiled figures; `token_load`'s defaults).
Pure: no clock, no I/O; `now` comes with every call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from router.replica_state import LatencyEstimate


class LatencyFitParams(BaseModel):
    """Parameters of the per-replica latency fits (module docstring)."""

    model_config = ConfigDict(extra="forbid")
    half_life_s: float = Field(default=60.0, gt=0.0)
    prior_weight: float = Field(default=2.0, gt=0.0)
    prefill_ref_s: float = Field(default=0.5, gt=0.0)
    decode_ref_s: float = Field(default=0.002, gt=0.0)
    min_ratio: float = Field(default=0.1, gt=0.0)
    max_ratio: float = Field(default=10.0, gt=0.0)
    default_prefill_tokens_per_s: float = Field(default=10_000.0, gt=0.0)
    decode_s_per_kv_token: float = Field(default=4e-8, ge=0.0)
    max_num_batched_tokens: int = Field(default=8192, ge=1)


def prior_prefill_s(
    work_tokens: int, seqs: int, kv_tokens: int, tps: float, c: float, budget_tokens: int
) -> float:
    """`token_load`'s prefill seconds for `work_tokens` beside `seqs` decodes reading
    `kv_tokens` of KV (module docstring)."""
    if kv_tokens <= 0:
        return work_tokens / tps
    budget = budget_tokens - seqs if budget_tokens > seqs else 1
    steps = -(-work_tokens // budget) if work_tokens > budget else 1
    return (work_tokens + steps * seqs) / tps + steps * c * kv_tokens


@dataclass(slots=True)
class _Fit:
    """Decayed sufficient statistics of one `y ≈ a + k·x` fit, in units of `ref` seconds
    (x/ref, y/ref), so the ridge `prior_weight·I` means the same for prefill and decode."""

    ref: float
    intercept_hold: float = 1.0  # h in the module docstring
    t: float = 0.0  # time the sums were last decayed to
    n: int = 0
    s11: float = 0.0  # Σ w
    s1x: float = 0.0  # Σ w x
    sxx: float = 0.0  # Σ w x²
    s1y: float = 0.0  # Σ w y
    sxy: float = 0.0  # Σ w x y

    def add(self, x: float, y: float, now: float, half_life_s: float) -> None:
        if self.n and now > self.t:
            decay = 0.5 ** ((now - self.t) / half_life_s)
            self.s11 *= decay
            self.s1x *= decay
            self.sxx *= decay
            self.s1y *= decay
            self.sxy *= decay
        if now > self.t or not self.n:
            self.t = now
        x /= self.ref
        y /= self.ref
        self.n += 1
        self.s11 += 1.0
        self.s1x += x
        self.sxx += x * x
        self.s1y += y
        self.sxy += x * y

    def solve(self, prior_weight: float, lo: float, hi: float) -> tuple[float, float]:
        """(a seconds, k): the ridge solution toward (0, 1) (module docstring)."""
        lam = prior_weight
        # [[h lam + s11, s1x], [s1x, lam + sxx]] · (a, k) = (s1y, lam·1 + sxy)
        m11, m12, m22 = self.intercept_hold * lam + self.s11, self.s1x, lam + self.sxx
        r1, r2 = self.s1y, lam + self.sxy
        det = m11 * m22 - m12 * m12
        if det <= 0.0 or not math.isfinite(det):
            return 0.0, 1.0
        a = (m22 * r1 - m12 * r2) / det
        rho = (m11 * r2 - m12 * r1) / det
        if rho < lo or rho > hi:  # clamped: refit the intercept for the clamped slope
            rho = min(hi, max(lo, rho))
            a = (r1 - m12 * rho) / m11
        return a * self.ref, rho


@dataclass(slots=True)
class _Pending:
    """What admission recorded for one request, until its prefill (and decode) is observed."""

    replica: str
    admitted: float
    prior_s: float
    prefilled: bool = False
    decode_replica: str | None = None
    decode_start: float = 0.0
    decode_x: float = 0.0


@dataclass(slots=True)
class _Replica:
    prefill: _Fit
    decode: _Fit
    estimate: LatencyEstimate = field(default_factory=LatencyEstimate)


class LatencyPredictor:
    """Per-replica latency fits from lifecycle observations (module docstring)."""

    def __init__(self, params: LatencyFitParams | None = None) -> None:
        self.params = params or LatencyFitParams()
        self._replicas: dict[str, _Replica] = {}
        self._pending: dict[str, _Pending] = {}

    def _replica(self, replica_id: str) -> _Replica:
        rep = self._replicas.get(replica_id)
        if rep is None:
            p = self.params
            rep = self._replicas[replica_id] = _Replica(
                _Fit(p.prefill_ref_s, 1.0), _Fit(p.decode_ref_s, 0.01)
            )
        return rep

    def estimate(self, replica_id: str) -> LatencyEstimate | None:
        """The replica's current estimate (None before its first observation)."""
        rep = self._replicas.get(replica_id)
        return rep.estimate if rep is not None else None

    # ---- observations ------------------------------------------------------------------------

    def admitted(self, request_id: str, replica_id: str, now: float, prior_s: float) -> None:
        """`replica_id` will prefill the request; the model predicts `prior_s` seconds."""
        self._pending[request_id] = _Pending(replica_id, now, prior_s)

    def prefill_done(self, request_id: str, now: float) -> str | None:
        """The request's prefill ended (leg returned, or first token of a local prefill): one
        prefill observation. Returns the replica whose estimate changed (None: unknown)."""
        pending = self._pending.get(request_id)
        if pending is None or pending.prefilled:
            return None
        pending.prefilled = True
        p = self.params
        rep = self._replica(pending.replica)
        rep.prefill.add(pending.prior_s, now - pending.admitted, now, p.half_life_s)
        self._refresh(rep)
        return pending.replica

    def decode_started(self, request_id: str, replica_id: str, now: float, step_s: float) -> None:
        """The request's first token on `replica_id`, where the model's per-step slow-down
        is `step_s` (`n / tps + c · K`)."""
        pending = self._pending.get(request_id)
        if pending is None:
            return
        pending.decode_replica = replica_id
        pending.decode_start = now
        pending.decode_x = step_s

    def finished(self, request_id: str, now: float, generated: int) -> str | None:
        """The request ended with `generated` output tokens: one decode observation when it
        decoded at least 2. Returns the replica whose estimate changed (None: none)."""
        pending = self._pending.pop(request_id, None)
        if pending is None or pending.decode_replica is None or generated < 2:
            return None
        p = self.params
        rep = self._replica(pending.decode_replica)
        per_token = (now - pending.decode_start) / (generated - 1)
        rep.decode.add(pending.decode_x, per_token, now, p.half_life_s)
        self._refresh(rep)
        return pending.decode_replica

    def forget(self, request_id: str) -> None:
        """The request was aborted or moved: drop what admission recorded."""
        self._pending.pop(request_id, None)

    def remove_replica(self, replica_id: str) -> None:
        self._replicas.pop(replica_id, None)

    def _refresh(self, rep: _Replica) -> None:
        p = self.params
        pa, pr = rep.prefill.solve(p.prior_weight, p.min_ratio, p.max_ratio)
        da, dr = rep.decode.solve(p.prior_weight, p.min_ratio, p.max_ratio)
        rep.estimate = LatencyEstimate(pa, pr, da, dr, rep.prefill.n, rep.decode.n)
