"""`latency_predictor` (prefill): `token_load`'s predicted finish time, calibrated per replica
by the lifecycle's learnt latency fit (router/latency_predictor.py; issue 15).

    W, uncached, K, n    as in `token_load` (router/plugins/scorers/token_load.py)
    tps(r)               the replica's profiled prefill tokens/s, else default_prefill_tokens_per_s
    c(r)                 the replica's own decode_s_per_kv_token (its hardware profile), else
                         decode_s_per_kv_token
    (a_p, k_p, k_d)(r)   the replica's learnt fit (`ReplicaSnapshot.latency`; (0, 1, 1) before
                         any observation; k_d read only with `learnt_decode`, else 1)
    prefill(r) = a_p + k_p · prior_prefill_s(W, n, K, tps, c, max_num_batched_tokens)
    decode(r)  = out · k_d · (n / tps + c · K)        (0 when K = 0)
    t(r)       = prefill(r) + decode(r)                seconds; lower is better

So with no observation (or every replica behaving as its profile says) this is `token_load`
with per-replica constants (`per_replica_decode_cost: true`); a replica that turns out 2x
slower than its profile is priced 2x once its fit has seen it (a throttled GPU, a noisy
neighbour, a wrong profile, interference the formula does not model). The learnt decode
intercept (the replica's base step time) is not charged: it is the same on every replica of a
pool of one hardware profile and, learnt, differs between them by noise only.

Parameters (defaults): `token_load`'s `default_prefill_tokens_per_s` 10000,
`max_num_batched_tokens` 8192, `decode_s_per_kv_token` 4e-8, `expected_output_tokens` 256;
the fit's `half_life_s` 60, `prior_weight` 2.0, `prefill_ref_s` 0.5, `decode_ref_s` 0.002,
`min_ratio` 0.1, `max_ratio` 10 (router/latency_predictor.py); `learnt_decode` false (true:
scale the decode term by the learnt `k_d`; off because on colocated replicas a request's mean
time per token is mostly other requests' prefill chunks, not the KV the term prices, and the
fit's `k_d` then wanders between its clamps: Mooncake 16C x3, first 2,000 requests, p95 TTFT
1,804 ms with it, 1,741 without; benchmarks/results/sim-latency-predictor/). The lifecycle
keeps the fits when any policy of the router has this scorer (`Part.latency_fit`); the fleet
simulator and the coordinator both drive that lifecycle, so the fits learn from the same
events in both.

Example::

    scorers: [{name: latency_predictor, params: {half_life_s: 120}}]
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from router.latency_predictor import LatencyFitParams, prior_prefill_s
from router.plugins.base import Scorer, ScorerOutput
from router.plugins.registry import register
from router.replica_state import LatencyEstimate, ReplicaSnapshot, RoutingRequest

_NO_FIT = LatencyEstimate()


class LatencyPredictorParams(LatencyFitParams):
    """Parameters of the `latency_predictor` scorer (the fit's, plus the decode horizon)."""

    expected_output_tokens: int = Field(default=256, ge=0)
    learnt_decode: bool = False


@register
class LatencyPredictorScorer(Scorer[LatencyPredictorParams]):
    """Learnt-calibrated finish time, in seconds; lower wins."""

    name = "latency_predictor"
    params_model = LatencyPredictorParams
    higher_is_better = False

    def latency_fit(self) -> LatencyFitParams:
        return LatencyFitParams.model_validate(
            self.params.model_dump(exclude={"expected_output_tokens", "learnt_decode"})
        )

    def score(
        self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
    ) -> ScorerOutput:
        p = self.params
        bs = request.block_size
        prompt = request.prompt_tokens
        out = p.expected_output_tokens
        if request.max_tokens is not None and request.max_tokens < out:
            out = request.max_tokens
        learnt_decode = p.learnt_decode
        scores: dict[str, float] = {}
        terms: dict[str, dict[str, float]] = {}
        for r in candidates:
            uncached = max(0, prompt - r.overlap_blocks * bs)
            work = r.prefill_tokens_queued + uncached
            tps = r.prefill_tokens_per_s or p.default_prefill_tokens_per_s
            c = r.decode_s_per_kv_token or p.decode_s_per_kv_token
            kv = r.decode_blocks * bs
            n = r.requests_in_flight if kv > 0 else 0
            fit = r.latency or _NO_FIT
            prior = prior_prefill_s(work, n, kv, tps, c, p.max_num_batched_tokens)
            prefill = fit.prefill_intercept_s + fit.prefill_ratio * prior
            k_d = fit.decode_ratio if learnt_decode else 1.0
            decode = out * k_d * (n / tps + c * kv) if kv > 0 else 0.0
            scores[r.replica_id] = prefill + decode
            terms[r.replica_id] = {
                "uncached_tokens": float(uncached),
                "queued_tokens": float(r.prefill_tokens_queued),
                "model_prefill_s": prior,
                "prefill_s": prefill,
                "decode_s": decode,
                "prefill_ratio": fit.prefill_ratio,
                "prefill_intercept_s": fit.prefill_intercept_s,
                "decode_ratio": fit.decode_ratio,
                "observations": float(fit.prefill_observations + fit.decode_observations),
            }
        return ScorerOutput(scores, terms)

    def describe(self, terms: dict[str, float]) -> str:
        return (
            f"prefill {terms['prefill_s'] * 1e3:.1f} ms (model {terms['model_prefill_s'] * 1e3:.1f}"
            f" ms x {terms['prefill_ratio']:.2f} + {terms['prefill_intercept_s'] * 1e3:.1f} ms, "
            f"{terms['observations']:.0f} observations) + decode slow-down "
            f"{terms['decode_s'] * 1e3:.1f} ms (x {terms['decode_ratio']:.2f})"
        )
