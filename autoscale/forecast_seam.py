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
from autoscale.predictors import LoadForecaster
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
    series: constant, EWMA, Holt or Kalman) behind this seam: the planners' default."""

    def __init__(self, kind: PredictorKind, params: PredictorParams | None = None) -> None:
        self.inner = LoadForecaster(kind, params)

    def observe(self, observation: Observation) -> None:
        self.inner.observe(observation)

    def forecast(self, horizon_s: float) -> LoadForecast:
        f = self.inner.forecast(horizon_s)
        return LoadForecast(f.arrival_rps, f.mean_isl_tokens, f.mean_osl_tokens, f.prefix_hit_rate)
