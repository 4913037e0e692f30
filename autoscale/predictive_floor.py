"""pdorch's predictive floor (planner steps 0-1): what the forecast load needs, now and ahead.

`PredictiveFloor` owns the forecaster and everything that turns its forecast into replica
counts; the planner (`autoscale.planner`) feeds it one observation per tick and reads a
`Term` per pool, plus the counts its stabilization reads (`FloorCounts`). Pure: `now` comes
with the observation; the state is the forecaster's and the recent ticks'.

- **Feed** (`feed`): one aggregate per `forecast_window_s` (0, the default: every tick).
- **Sizing** (`compute`): from the forecaster's load at now and at `startup_s` ahead (the
  larger need wins, so capacity is asked for before the load arrives and not released before
  it leaves; before the first whole window, the partial windows' load). Only the rate is
  projected, at most `trend_cap` (1.5) x its level, and only by the mean growth projected
  over the last `trend_hold_s` (30 s: `_sustained`), so a one-tick trend is noise, not an
  order. Options: `trend_age` and `release_after_ticks` (`autoscale.projections`, Round 6),
  `decode_residence_mean` (`autoscale.residence`) and `decode_correction_on_target`
  (`autoscale.sizing`, Round 7): all off by default.
  `N_p = ceil(rate·ISL·(1-hit) / (C_p(ISL_u, TTFT)·h/k_p))`,
  `N_d = ceil(rate·(T_own + OSL·ITL) / (B_d(ISL+OSL/2, ITL)·h/k_d))`, `T_own` = the model's
  prefill time of the uncached prompt capped at the TTFT target, `h` = `headroom` (0.9), `k`
  the planner's correction factors.
- **Cold-start growth** (`cold_start_growth` g per pool, the policy's `planner:` option;
  default none, g = 1: off): the floor for the load `startup_s` ahead is sized for at least
  `g x` the level, `rate_ahead = max(projection, g·L)` (the projection as above: sustained,
  capped at `trend_cap`·L). Why: a replica ordered now serves `startup_s` later, so the pool
  must already hold what the load can grow to in one cold start; a trend cannot see a ramp
  that has not started. With `perf_model.decode_burst_queue` (a decode model with no
  over-count left to act as headroom) the 600 s day ramps 18 -> 40 rps over the 120 s before
  one decode replica fills (85-205 s) while the level and its Holt trend are flat: the second
  decode replica had to be ordered at 18 rps. Measured there (Round 10,
  `benchmarks/results/autoscale-round10/`): decode g 1.5 / 2.0 / 2.5 held 94.20 / 94.22 /
  99.63 % within both. A standing headroom, not a forecast: it costs replicas at the peaks.
- **Ramp order** (`ramp_epsilon` ε, the policy's `planner:` option; 0: off): while the floor
  for the load `startup_s` ahead is sized for a rate above the level, its need is `need + ε`,
  so replica k is ordered at `need > k - ε` (`autoscale.ramp_edge`, Round 13).
- **Cold-start spare** (`cold_start_spare` s per pool, the policy's `planner:` option; default
  none, s = 0: off): the floor for the load `startup_s` ahead needs at least the floor for the
  load now plus `s` replicas, `need_ahead = max(need(rate_ahead), need(L) + s)`, in replicas,
  not a multiple of the rate. Why: a growth factor scales with the pool, so on a big pool it
  asks for far more than the load can add in one cold start. On the Mooncake x2 prefix
  (Round 13, `benchmarks/results/autoscale-round13-decode/`) decode g 2.5 asked for 9-15
  decode replicas where the need for the load now read 5-7 and the oracle runs 2-4, and the
  16-GPU budget gave the excess from prefill (85.63 % within both against the default model's
  92.90 %); on the 600 s day's small night pool (18 rps, need 0.68) one spare replica is the
  second replica the ramp needs (`cold_start_growth`'s reason above).
  `cold_start_spare_until_s` T (default null: always): the spare applies to ticks before T
  only. Why: measured, it is the whole Azure hour's largest decode excess over the oracle
  (Round 14, `benchmarks/results/autoscale-round14-bound/`: 1.51 decode GPU-h in steady
  segments, the spare 1.5 held the whole hour), while its wins were opening ramps.
  `cold_start_spare_mode: learnt`: s is measured per pool, the growth of the need for the
  load now within one `startup_s` over the recent past (`autoscale.spare`, Round 15), the
  policy's s its prior. Reason `cold-start-spare` where the spare sets the floor.
- **Learnt burst dispersion** (`perf_model.decode_burst_dispersion_online`, with
  `decode_burst_queue`; off by default): the decode floor's burst quantile reads `I` learnt
  from the arrivals of each fed window (`autoscale.dispersion`), not the fixed
  `decode_burst_dispersion` (its prior for the first minute).
- **Counts** (`counts[pool]`): the hysteresis counts of the floor's fractional need
  (`autoscale.stabilization`): raw and hold counts of the floor for the load now, the hold
  count of the floor (the larger of now and ahead), and its up count.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from autoscale.dispersion import ArrivalDispersion
from autoscale.forecast_seam import Forecaster, LoadForecast, aggregate
from autoscale.load_window import LoadWindow
from autoscale.perf_model_base import PerfModel
from autoscale.planner_terms import Term, decode_floor_need
from autoscale.policy import SloPolicy
from autoscale.projections import AheadRelease, Projection, TrendAge
from autoscale.ramp_edge import ramp_term
from autoscale.residence import ResidenceMean
from autoscale.signals import Observation, Pool
from autoscale.sizing import (
    itl_target_s,
    prefill_need,
    replicas_for,
    ttft_target_s,
    uncached_tokens,
)
from autoscale.spare import LearntSpare, LearntSpareOptions
from autoscale.stabilization import hold_count, up_count

POOLS = (Pool.PREFILL, Pool.DECODE)


@dataclass(frozen=True, slots=True)
class FloorCounts:
    """One pool's floor counts of a tick (`autoscale.stabilization`'s hysteresis counts)."""

    raw_now: int  # ceil(need) of the floor for the load now
    now: int  # hold count of the floor for the load now
    hold: int  # hold count of the floor (the larger of now and `startup_s` ahead)
    up: int  # up count of the floor


class PredictiveFloor:
    """The forecaster, its feed and the floor sized from it (module docstring)."""

    def __init__(
        self,
        policy: SloPolicy,
        perf_model: PerfModel,
        forecaster: Forecaster,
        *,
        headroom: float,
        forecast_window_s: float,
        trend_cap: float,
        trend_hold_s: float,
        hysteresis: float,
        trend_age: TrendAge | None,
        release: AheadRelease | None,
        residence: ResidenceMean | None,
        decode_correction_on_target: bool,
        growth: dict[Pool, float] | None = None,
        ramp_epsilon: float = 0.0,
        spare: dict[Pool, float] | None = None,
        spare_until_s: float | None = None,
        spare_learnt: LearntSpareOptions | None = None,
    ) -> None:
        self.policy = policy
        self.perf = perf_model
        self.forecaster = forecaster
        self.headroom = headroom
        self.interval_s = policy.intervals.reactive_s
        self.forecast_window_s = forecast_window_s
        self.trend_cap = trend_cap
        self.trend_hold_s = trend_hold_s
        self.hysteresis = hysteresis
        self._trend_age = trend_age
        self._release = release
        self._residence = residence
        self.decode_correction_on_target = decode_correction_on_target
        # `cold_start_growth` per pool (module docstring, "Cold-start growth"); 1: off
        self.growth = {p: (growth or {}).get(p, 1.0) for p in POOLS}
        # an order on a ramp at `need > k - ε` (`autoscale.ramp_edge`); 0: off
        self.ramp_epsilon = ramp_epsilon
        # `cold_start_spare` per pool (module docstring, "Cold-start spare"); 0: off
        self.spare = {p: (spare or {}).get(p, 0.0) for p in POOLS}
        # `cold_start_spare_until_s`: the spare stands before this time only; None: always
        self.spare_until_s = spare_until_s
        # `cold_start_spare_mode: learnt`: the spare measured for each pool `spare` names, its
        # value the prior (0: none; `autoscale.spare`); None: the fixed spare
        self.learnt = {
            p: LearntSpare(policy.limits(p).startup_s, self.spare[p], spare_learnt)
            for p in POOLS
            if spare_learnt is not None and p in (spare or {})
        }
        self.projection: dict[Pool, Projection | None] = {p: None for p in POOLS}
        self.counts: dict[Pool, FloorCounts] = {}
        self.level_rps = 0.0  # the last `compute`'s level rate (`autoscale.prefill_release`)
        self._decode_mean = 0.0
        self._ahead: dict[Pool, deque[tuple[float, float]]] = {p: deque() for p in POOLS}
        self._agg: list[Observation] = []
        self.fed = False  # has the forecaster seen a whole window yet
        # the burst quantile's `I` learnt from the arrivals (`autoscale.dispersion`); None: fixed
        cfg = policy.perf_model
        self.dispersion = (
            ArrivalDispersion(cfg.decode_burst_dispersion)
            if cfg.decode_burst_queue and cfg.decode_burst_dispersion_online
            else None
        )

    # -- forecast input ------------------------------------------------------------------
    def feed(self, obs: Observation) -> bool:
        """Feed the forecaster one aggregate per `forecast_window_s` (nothing before the first
        whole one; 0 = every tick, the default): fewer, less noisy points for the trend, at the
        cost of reacting a window later (benchmarks/results/AUTOSCALE.md measures both). True
        when the forecaster saw something new."""
        if self.dispersion is not None:
            self.dispersion.observe(obs.now, obs.num_requests, obs.window_s)
        self._agg.append(obs)
        span = sum(o.window_s for o in self._agg)
        if span < self.forecast_window_s - 1e-9:
            return False
        self.forecaster.observe(aggregate(self._agg))
        self._agg = []
        self.fed = True
        return True

    # -- sizing ----------------------------------------------------------------------------
    def _floor_for(self, load: LoadForecast, correction: dict[Pool, float]) -> dict[Pool, Term]:
        rate, isl, osl, hit = load
        ttft = ttft_target_s(self.policy)
        t_own = self.perf.prefill_time_s(uncached_tokens(isl, hit)) if isl > 0 else 0.0
        # a request occupies a decode replica from its first token on: prefill queueing is
        # not decode residence (the observed mean TTFT used here made the decode floor 16 %
        # larger while the prefill pool was short), so the term is the model's own prefill
        # time, as `sizing.size_window` has it
        t_term = min(t_own, ttft)
        inputs = {"rate_rps": rate, "isl": isl, "osl": osl, "hit": hit, "ttft_term_s": t_term}
        dispersion = None if self.dispersion is None else self.dispersion.value()
        p = prefill_need(
            self.perf,
            rate,
            isl,
            hit,
            ttft,
            correction=correction[Pool.PREFILL],
            headroom=self.headroom,
        )
        d = decode_floor_need(
            self.perf,
            self.policy,
            rate,
            isl,
            osl,
            hit,
            correction[Pool.DECODE],
            self.headroom,
            self.decode_correction_on_target,
            dispersion,
        )
        if dispersion is not None:
            inputs["dispersion"] = dispersion
        return {
            Pool.PREFILL: Term(replicas_for(p), "ttft-throughput", {**inputs, "need": p}),
            Pool.DECODE: Term(replicas_for(d), "itl-concurrency", {**inputs, "need": d}),
        }

    def compute(self, obs: Observation, correction: dict[Pool, float]) -> dict[Pool, Term]:
        """This tick's floor per pool (module docstring); sets `counts` and `projection`."""
        out: dict[Pool, Term] = {}
        level = LoadForecast(*self.forecaster.forecast(0.0))
        if not self.fed and self._agg:  # before the first whole window: what it saw
            a = aggregate(self._agg)
            level = LoadForecast(
                a.arrival_rps, a.mean_isl_tokens, a.mean_osl_tokens, a.prefix_hit_rate
            )
        self.level_rps = level.rate_rps
        if self._release is not None:
            self._release.observe(obs.now, level.rate_rps)
        # while a released projection's bar stands, nothing is projected (`autoscale.projections`)
        project = self._release is None or not self._release.suppressed
        for pool in POOLS:
            horizon = self.policy.limits(pool).startup_s
            best: Term | None = None
            at: dict[float, int] = {}
            raw_at: dict[float, int] = {}
            hold = up = 0
            need_now = spare = 0.0
            self.projection[pool] = None
            for h in (0.0, horizon) if project else (0.0,):
                fc = self.forecaster.forecast(h) if self.fed else level
                ahead = LoadForecast(*fc)
                projected = ahead.rate_rps
                if h > 0 and self._trend_age is not None:
                    projected = self._trend_age.damp(
                        obs.now, level.rate_rps, projected, h, self.interval_s
                    )
                # only the rate is projected (lengths and hit rate at their level), and by at
                # most `trend_cap` x the level: a trend is evidence of growth, not a measure
                rate = min(projected, self.trend_cap * level.rate_rps)
                if h > 0:
                    rate = self._sustained(pool, obs.now, rate, level.rate_rps)
                    # at least the growth a cold start must absorb (module docstring); off
                    # at 1, so a falling projection (`trend_hold_s` 0) still falls
                    if self.growth[pool] > 1.0:
                        rate = max(rate, self.growth[pool] * level.rate_rps)
                    if self._release is not None:
                        self.projection[pool] = self._release.track(
                            Projection(obs.now, level.rate_rps, rate, h)
                        )
                load = level._replace(rate_rps=rate)
                term = self._floor_for(load, correction)[pool]
                if h > 0:
                    term = ramp_term(term, rate, level.rate_rps, self.ramp_epsilon)
                if pool is Pool.DECODE and self._residence is not None:
                    term = self._over_residence(obs.now, term, h, rate, level.rate_rps)
                term.inputs["horizon_s"] = h
                need = float(term.inputs["need"])
                if h <= 0:
                    need_now = need
                    learnt = self.learnt.get(pool)
                    spare = self.spare[pool] if learnt is None else learnt.observe(obs.now, need)
                elif (
                    spare > 0
                    and need < need_now + spare
                    and (self.spare_until_s is None or obs.now < self.spare_until_s)
                ):
                    # at least the need now plus the spare (module docstring)
                    need = need_now + spare
                    inputs = {**term.inputs, "need": need, "spare": spare}
                    term = Term(replicas_for(need), "cold-start-spare", inputs)
                at[h] = hold_count(need, self.hysteresis)
                up = max(up, up_count(need, self.hysteresis))
                raw_at[h] = term.replicas
                hold = max(hold, at[h])
                if best is None or term.replicas > best.replicas:
                    best = term
            assert best is not None
            out[pool] = best
            self.counts[pool] = FloorCounts(raw_at[0.0], at[0.0], hold, up)
        return out

    def start_fleet(self, window: LoadWindow, fleet: dict[Pool, int]) -> dict[Pool, int]:
        """The fleet at t = 0 with each pool's `cold_start_spare` (module docstring): at least
        `ceil(need(L) + s)` for the load `window` had before the run, the floor the planner
        holds at that level; `fleet` (the harness's shared start) where it is larger, and
        unchanged for a pool without a spare."""
        load = LoadForecast(
            window.arrival_rps,
            window.mean_isl_tokens,
            window.mean_osl_tokens,
            window.prefix_hit_rate,
        )
        terms = self._floor_for(load, {p: 1.0 for p in POOLS})
        out = dict(fleet)
        for pool in POOLS:
            if self.spare[pool] > 0:
                need = float(terms[pool].inputs["need"]) + self.spare[pool]
                lim = self.policy.limits(pool)
                out[pool] = min(lim.max, max(out[pool], replicas_for(need)))
        return out

    def _over_residence(
        self, now: float, term: Term, horizon: float, rate: float, level_rate: float
    ) -> Term:
        """The decode floor's need as its mean over the last residence time
        (`autoscale.residence`): this tick's need joins the mean at the horizon 0; a floor
        for the load ahead is that mean scaled by the projected rate over the level's."""
        assert self._residence is not None
        tick = float(term.inputs["need"])
        if horizon <= 0:
            x = term.inputs
            residence = float(x["ttft_term_s"]) + float(x["osl"]) * itl_target_s(self.policy)
            self._decode_mean = self._residence.add(now, tick, residence)
            need = self._decode_mean
            term.inputs["residence_s"] = residence
        else:
            need = self._decode_mean * rate / level_rate if level_rate > 0 else tick
        return Term(replicas_for(need), term.reason, {**term.inputs, "need": need, "tick": tick})

    def _sustained(self, pool: Pool, now: float, projected: float, level: float) -> float:
        """The projected rate's growth over the level, as sustained for `trend_hold_s`: the
        level plus the mean growth projected by the ticks of the last `trend_hold_s` (0: the
        projection as it is). A Holt trend over 5 s windows is mostly noise (Azure x14: ±18 %
        per window, so the projection sat at the 1.5x cap about half the time and the 180 s
        scale-down window kept its peaks); a real ramp projects growth on average. (The
        smallest growth of the window was tried: at the diurnal day's night rates one noisy
        tick cancelled the ramp's order and attainment fell to 83 %.)"""
        hist = self._ahead[pool]
        growth = projected - level
        hist.append((now, growth))
        while hist and now - hist[0][0] > self.trend_hold_s:
            hist.popleft()
        if self.trend_hold_s <= 0:
            return projected
        return level + max(0.0, sum(g for _, g in hist) / len(hist))
