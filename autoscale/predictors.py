"""Load predictors over a scalar series, and the `LoadForecaster` a planner asks.

Each predictor is fed `observe(value, now)` in time order and answers `forecast(horizon_s)`:
the series' value `horizon_s` seconds after the last observation (None before the first one).
Pure: time comes only from `now`; no clocks.

- `ConstantPredictor`: the last value (Dynamo's `constant`).
- `EwmaPredictor(alpha)`: `s_1 = x_1`, `s_n = alpha*x_n + (1-alpha)*s_(n-1)`; forecast `s_n`
  at any horizon. A step from 0 to 1 after n observations of 1 gives `1 - (1-alpha)^n`.
  alpha is per observation (the planner feeds one per predictive interval).
- `HoltPredictor(alpha, beta)`: double exponential smoothing with the trend per second, so
  uneven spacing is handled. With `dt` = seconds since the previous observation:
      level_n = alpha*x_n + (1-alpha)*(level_(n-1) + trend_(n-1)*dt)
      trend_n = beta*(level_n - level_(n-1))/dt + (1-beta)*trend_(n-1)
  forecast `level + trend*horizon_s`. Initialised at `level = x_1, trend = 0`, then at the
  second observation `level = x_2, trend = (x_2 - x_1)/dt`. On a linear ramp it then holds
  the exact slope.
- `KalmanPredictor(q_level, q_trend, r, min_points)`: a local-linear-trend Kalman filter
  (state `[level, trend per step]`, transition `[[1, 1], [0, 1]]`, process noise
  `diag(q_level, q_trend)`, measurement noise `r`, observed `level`), the model of Dynamo's
  `kalman` predictor, whose defaults (1.0, 0.1, 10, 5) these are. A step is the spacing of the
  observations (the last gap, in seconds), so `forecast(h) = level + trend*h/step`. Before
  `min_points` observations it answers the last value. Initial covariance `diag(r, r)`.

The noises are in the series' own units squared (requests/s, tokens), as in Dynamo; for a
series of large magnitude (ISL in tokens) a small `r` means "trust each observation".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from autoscale.policy import PredictorKind, PredictorParams
from autoscale.signals import Observation


class Predictor(ABC):
    """A scalar series' forecaster (see module docstring)."""

    def __init__(self) -> None:
        self.count = 0
        self.last_value: float | None = None
        self.last_now: float | None = None

    def observe(self, value: float, now: float) -> None:
        """Feed one observation; `now` must increase (a repeated or older `now` is ignored)."""
        if self.last_now is not None and now <= self.last_now:
            return
        dt = None if self.last_now is None else now - self.last_now
        self._update(float(value), dt)
        self.count += 1
        self.last_value = float(value)
        self.last_now = now

    @abstractmethod
    def _update(self, value: float, dt: float | None) -> None:
        """Fold `value` in; `dt` = seconds since the previous observation (None: the first)."""

    @abstractmethod
    def forecast(self, horizon_s: float = 0.0) -> float | None:
        """The value `horizon_s` after the last observation; None before any."""


class ConstantPredictor(Predictor):
    """The last value."""

    def _update(self, value: float, dt: float | None) -> None:
        pass

    def forecast(self, horizon_s: float = 0.0) -> float | None:
        return self.last_value


class EwmaPredictor(Predictor):
    """Exponentially weighted moving average, weight `alpha` on the newest value."""

    def __init__(self, alpha: float = 0.3) -> None:
        super().__init__()
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.smoothed: float | None = None

    def _update(self, value: float, dt: float | None) -> None:
        if self.smoothed is None:
            self.smoothed = value
        else:
            self.smoothed = self.alpha * value + (1 - self.alpha) * self.smoothed

    def forecast(self, horizon_s: float = 0.0) -> float | None:
        return self.smoothed


class HoltPredictor(Predictor):
    """Holt's linear trend (double exponential smoothing), trend per second."""

    def __init__(self, alpha: float = 0.5, beta: float = 0.3) -> None:
        super().__init__()
        if not (0 < alpha <= 1 and 0 < beta <= 1):
            raise ValueError(f"alpha and beta must be in (0, 1], got {alpha}, {beta}")
        self.alpha = alpha
        self.beta = beta
        self.level: float | None = None
        self.trend_per_s = 0.0

    def _update(self, value: float, dt: float | None) -> None:
        if self.level is None or dt is None:
            self.level = value
            return
        if self.count == 1:
            # the standard initialisation: level = x_2, trend = the first difference
            self.trend_per_s = (value - self.level) / dt
            self.level = value
            return
        previous = self.level
        level = self.alpha * value + (1 - self.alpha) * (previous + self.trend_per_s * dt)
        slope = (level - previous) / dt
        self.trend_per_s = self.beta * slope + (1 - self.beta) * self.trend_per_s
        self.level = level

    def forecast(self, horizon_s: float = 0.0) -> float | None:
        if self.level is None:
            return None
        return self.level + self.trend_per_s * horizon_s


class KalmanPredictor(Predictor):
    """Local-linear-trend Kalman filter (see module docstring)."""

    def __init__(
        self, q_level: float = 1.0, q_trend: float = 0.1, r: float = 10.0, min_points: int = 5
    ) -> None:
        super().__init__()
        if q_level < 0 or q_trend < 0 or r <= 0 or min_points < 1:
            raise ValueError("need q_level, q_trend >= 0, r > 0, min_points >= 1")
        self.q_level = q_level
        self.q_trend = q_trend
        self.r = r
        self.min_points = min_points
        self.level = 0.0
        self.trend = 0.0  # per step
        self.step_s = 0.0  # the last gap between observations
        # covariance [[p00, p01], [p01, p11]]
        self.p00 = self.p01 = self.p11 = 0.0

    def _update(self, value: float, dt: float | None) -> None:
        if dt is None:
            self.level, self.trend = value, 0.0
            self.p00, self.p01, self.p11 = self.r, 0.0, self.r
            return
        self.step_s = dt
        # predict: x = F x, P = F P F^T + Q with F = [[1, 1], [0, 1]]
        level = self.level + self.trend
        p00 = self.p00 + 2 * self.p01 + self.p11 + self.q_level
        p01 = self.p01 + self.p11
        p11 = self.p11 + self.q_trend
        # update with H = [1, 0]
        s = p00 + self.r
        k0, k1 = p00 / s, p01 / s
        innovation = value - level
        self.level = level + k0 * innovation
        self.trend = self.trend + k1 * innovation
        self.p00 = (1 - k0) * p00
        self.p01 = (1 - k0) * p01
        self.p11 = p11 - k1 * p01

    def forecast(self, horizon_s: float = 0.0) -> float | None:
        if self.last_value is None:
            return None
        if self.count < self.min_points or self.step_s <= 0:
            return self.last_value
        return self.level + self.trend * horizon_s / self.step_s


def make_predictor(kind: PredictorKind, params: PredictorParams | None = None) -> Predictor:
    """A fresh predictor of `kind` with the policy's parameters (defaults if None)."""
    p = params if params is not None else PredictorParams()
    if kind is PredictorKind.CONSTANT:
        return ConstantPredictor()
    if kind is PredictorKind.EWMA:
        return EwmaPredictor(p.ewma_alpha)
    if kind is PredictorKind.HOLT:
        return HoltPredictor(p.holt_alpha, p.holt_beta)
    return KalmanPredictor(p.kalman_q_level, p.kalman_q_trend, p.kalman_r, p.kalman_min_points)


@dataclass(frozen=True, slots=True)
class LoadForecast:
    """The load expected at `now + horizon_s` (clamped to physical ranges)."""

    now: float
    horizon_s: float
    arrival_rps: float
    mean_isl_tokens: float
    mean_osl_tokens: float
    prefix_hit_rate: float

    @property
    def uncached_isl_tokens(self) -> float:
        """Prompt tokens per request that must be prefilled: ISL*(1 - hit)."""
        return self.mean_isl_tokens * (1.0 - self.prefix_hit_rate)


SERIES = ("arrival_rps", "mean_isl_tokens", "mean_osl_tokens", "prefix_hit_rate")


class LoadForecaster:
    """One predictor per load series, fed from `Observation`s.

    The arrival rate is fed every observation; ISL, OSL and the prefix-hit rate only from
    windows that saw requests (an empty window says nothing about request shape). A planner
    calls `observe` once per predictive interval (the predictors' alpha/noise are per
    observation) and `forecast(horizon_s)`, typically with horizon = the pools' `startup_s`
    (the load when capacity asked for now arrives).
    """

    def __init__(self, kind: PredictorKind, params: PredictorParams | None = None) -> None:
        self.kind = kind
        self.predictors: dict[str, Predictor] = {s: make_predictor(kind, params) for s in SERIES}
        self.last_now: float | None = None
        # The shape series' own clock: it advances only over windows that saw requests, so an
        # idle gap does not exist for them (a trend is never projected through one, neither
        # when forecasting nor when the next window updates the level: Holt's update adds
        # trend x gap, which took a burst's 8k-token ISL to 17k on the first short prompt after
        # a few idle seconds and flapped the prefill floor; tests/coordinator/test_closed_loop).
        self._shape_clock: float | None = None
        self._shape_seen_at: float | None = None

    def observe(self, observation: Observation) -> None:
        o = observation
        self.predictors["arrival_rps"].observe(o.arrival_rps, o.now)
        if o.num_requests > 0:
            if self._shape_clock is None or self._shape_seen_at is None:
                self._shape_clock = o.now
            else:
                self._shape_clock += max(0.0, min(o.now - self._shape_seen_at, o.window_s))
            self._shape_seen_at = o.now
            t = self._shape_clock
            self.predictors["mean_isl_tokens"].observe(o.mean_isl_tokens, t)
            self.predictors["mean_osl_tokens"].observe(o.mean_osl_tokens, t)
            self.predictors["prefix_hit_rate"].observe(o.prefix_hit_rate, t)
        if self.last_now is None or o.now > self.last_now:
            self.last_now = o.now

    def _at(self, series: str, horizon_s: float) -> float:
        p = self.predictors[series]
        if p.last_now is None or self.last_now is None:
            return 0.0
        # a shape series forecasts `horizon_s` from its own last point: an idle gap carries no
        # evidence about request shape (a burst's ISL used to drift from 5.5k to 60k tokens
        # over a few idle seconds this way)
        value = p.forecast(horizon_s)
        return 0.0 if value is None else value

    def forecast(self, horizon_s: float = 0.0) -> LoadForecast:
        """The expected load `horizon_s` after the last observation (zeros before any)."""
        return LoadForecast(
            now=self.last_now if self.last_now is not None else 0.0,
            horizon_s=horizon_s,
            arrival_rps=max(0.0, self._at("arrival_rps", horizon_s)),
            mean_isl_tokens=max(0.0, self._at("mean_isl_tokens", horizon_s)),
            mean_osl_tokens=max(0.0, self._at("mean_osl_tokens", horizon_s)),
            prefix_hit_rate=min(1.0, max(0.0, self._at("prefix_hit_rate", horizon_s))),
        )

    def forecast_peak(self, horizon_s: float) -> LoadForecast:
        """Per series, the larger of the forecast now and at `horizon_s` (forecasts are linear,
        so this is their maximum over the horizon); the hit rate takes the smaller (less cache
        means more prefill). A planner sizing for the whole startup window uses this."""
        a, b = self.forecast(0.0), self.forecast(horizon_s)
        return LoadForecast(
            now=b.now,
            horizon_s=horizon_s,
            arrival_rps=max(a.arrival_rps, b.arrival_rps),
            mean_isl_tokens=max(a.mean_isl_tokens, b.mean_isl_tokens),
            mean_osl_tokens=max(a.mean_osl_tokens, b.mean_osl_tokens),
            prefix_hit_rate=min(a.prefix_hit_rate, b.prefix_hit_rate),
        )
