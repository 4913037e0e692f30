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

from collections import deque
from dataclasses import replace
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


def aggregate(windows: list[Observation]) -> Observation:
    """One observation over consecutive windows: request-weighted ISL/OSL, token-weighted
    hit rate, rate = requests / seconds; the rest (pools, latencies) from the last window."""
    last = windows[-1]
    if len(windows) == 1:
        return last
    secs = sum(o.window_s for o in windows)
    n = [o.num_requests or o.arrival_rps * o.window_s for o in windows]
    total = sum(n)
    isl = sum(k * o.mean_isl_tokens for k, o in zip(n, windows, strict=True))
    osl = sum(k * o.mean_osl_tokens for k, o in zip(n, windows, strict=True))
    hit = sum(k * o.mean_isl_tokens * o.prefix_hit_rate for k, o in zip(n, windows, strict=True))
    return replace(
        last,
        window_s=secs,
        num_requests=round(total),
        arrival_rps=total / secs if secs > 0 else 0.0,
        mean_isl_tokens=isl / total if total else last.mean_isl_tokens,
        mean_osl_tokens=osl / total if total else last.mean_osl_tokens,
        prefix_hit_rate=hit / isl if isl else last.prefix_hit_rate,
    )


class SlidingLoad:
    """The load of the last `span_s` seconds, as one observation (`aggregate` of the windows
    that started within it; the newest is always kept; `span_s` 0: the newest alone).

    Why: pdorch's planner ticks every 5 s, and a 5 s window's arrivals are noisy (Azure x14:
    single ticks at 80-130 rps where ~70-80 arrive, the overlay's copies arriving in clumps), so
    a floor or a reactive need read from one window is a one-tick spike that a 180 s
    stabilization window then holds for three minutes. Over 30 s (six windows) the same
    trace's spikes are averaged out, at ~15 s of lag on a ramp (the forecaster's horizon is
    120 s). Only the load (rate, lengths, hit rate) is averaged: the pools, queues and
    latencies are the newest window's, so a real burst still shows in the queue at once.
    """

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self._windows: deque[Observation] = deque()

    def add(self, observation: Observation) -> Observation:
        """Fold in the newest window; the load of the last `span_s` seconds."""
        w = self._windows
        w.append(observation)
        now = observation.now
        while len(w) > 1 and now - (w[0].now - w[0].window_s) > self.span_s + 1e-9:
            w.popleft()
        return aggregate(list(w))

    def current(self) -> Observation | None:
        """The last answer of `add` (None before the first window)."""
        return aggregate(list(self._windows)) if self._windows else None
