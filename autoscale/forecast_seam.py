"""The seam between a planner and a load predictor.

A planner holds one `Forecaster`: each tick it calls `observe(observation)`, then
`forecast(horizon_s)` for the load expected `horizon_s` from now, as a `LoadForecast`
`(rate_rps, isl_tokens, osl_tokens, prefix_hit_rate)` (any 4-tuple in that order works).
The predictors of `autoscale/` (constant, EWMA, Holt, Kalman) plug in here;
`PredictorForecaster` puts them behind the seam (the registry's factories give pdorch and
dynamo-planner the policy's `predictor`); `EwmaForecaster` is the small built-in default of a
planner constructed directly.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from autoscale.policy import PredictorKind, PredictorParams
from autoscale.predictors import EwmaPredictor, LoadForecaster
from autoscale.signals import Observation


class LoadForecast(NamedTuple):
    rate_rps: float
    isl_tokens: float
    osl_tokens: float
    prefix_hit_rate: float


class Forecaster(Protocol):
    def observe(self, observation: Observation) -> None: ...

    def forecast(self, horizon_s: float) -> tuple[float, float, float, float]: ...


class EwmaForecaster:
    """Exponentially weighted mean of each series; flat forecast at every horizon.

    `x ← x + alpha·(obs - x)` per observation; `alpha = 1` is the last value (Dynamo's
    `constant` predictor). Lengths and hit rate only update from windows that saw requests, so
    an idle window does not drag the mean prompt length to 0. Default `alpha = 0.5`.
    """

    def __init__(self, alpha: float = 0.5) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self._state: LoadForecast | None = None

    def observe(self, observation: Observation) -> None:
        o = observation
        seen = o.num_requests > 0 or o.arrival_rps > 0
        if self._state is None:
            if seen:
                self._state = LoadForecast(
                    o.arrival_rps, o.mean_isl_tokens, o.mean_osl_tokens, o.prefix_hit_rate
                )
            return
        a = self.alpha
        s = self._state
        rate = s.rate_rps + a * (o.arrival_rps - s.rate_rps)
        if not seen:
            self._state = s._replace(rate_rps=rate)
            return
        self._state = LoadForecast(
            rate,
            s.isl_tokens + a * (o.mean_isl_tokens - s.isl_tokens),
            s.osl_tokens + a * (o.mean_osl_tokens - s.osl_tokens),
            s.prefix_hit_rate + a * (o.prefix_hit_rate - s.prefix_hit_rate),
        )

    def forecast(self, horizon_s: float) -> LoadForecast:
        return self._state or LoadForecast(0.0, 0.0, 0.0, 0.0)


class PredictorForecaster:
    """The policy's predictors (`autoscale.predictors.LoadForecaster(kind, params)`, one per
    series: constant, EWMA, Holt or Kalman) behind this seam: the planners' default.

    `request_weighted_isl` (pdorch's factory sets it; dynamo-planner keeps Dynamo's own ISL
    series): the ISL answered is `ewma(prompt tokens/s) / ewma(arrivals/s)` (alpha = `ewma_alpha`),
    both fed every window (0 in idle ones), i.e. the mean prompt length weighted by
    the requests that carried it. Why: the prefill load is their product, and smoothing rate and
    ISL apart multiplies two lags into a load that never existed: right after a burst of 16
    5.5k-token prompts, short prompts arriving at ~40 rps met an ISL level still at ~7k and sized
    the prefill floor for 270k tokens/s (8 replicas; a flap in tests/coordinator/
    test_closed_loop.py). Weighted, the burst's few requests lose their weight as the rate
    series does. Falls back to the ISL series while either level is 0.
    """

    def __init__(
        self,
        kind: PredictorKind,
        params: PredictorParams | None = None,
        *,
        request_weighted_isl: bool = False,
    ) -> None:
        self.inner = LoadForecaster(kind, params)
        self.request_weighted_isl = request_weighted_isl
        # a weighted mean, not a forecast: EWMA whatever the kind (Holt's levels overshoot
        # below 0 after a spike), with the policy's `ewma_alpha`
        alpha = (params or PredictorParams()).ewma_alpha
        self._rate = EwmaPredictor(alpha)
        self._prompt_tok_s = EwmaPredictor(alpha)

    def observe(self, observation: Observation) -> None:
        o = observation
        self.inner.observe(o)
        if self.request_weighted_isl:
            self._rate.observe(o.arrival_rps, o.now)
            self._prompt_tok_s.observe(o.arrival_rps * o.mean_isl_tokens, o.now)

    def _weighted_isl(self) -> float | None:
        rate, tokens = self._rate.forecast(0.0), self._prompt_tok_s.forecast(0.0)
        if rate is None or tokens is None or rate <= 0 or tokens <= 0:
            return None
        return tokens / rate

    def forecast(self, horizon_s: float) -> LoadForecast:
        f = self.inner.forecast(horizon_s)
        isl = self._weighted_isl() if self.request_weighted_isl else None
        return LoadForecast(
            f.arrival_rps,
            f.mean_isl_tokens if isl is None else isl,
            f.mean_osl_tokens,
            f.prefix_hit_rate,
        )
