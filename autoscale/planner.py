"""pdorch's planner: a predictive floor, fast reactive steps above it, safe scale-down.

Every `policy.intervals.reactive_s` (`interval_s`), for each pool:

0. **The load may be read as its sliding mean** over the last `level_window_s` (default 0:
   each 5 s window as it is; measured at `LEVEL_WINDOWS` 6 windows, 30 s;
   `forecast_seam.SlidingLoad`): rate = requests / seconds, request-weighted ISL/OSL,
   token-weighted hit rate, over the windows that started within it; pools, queues and
   latencies are the newest window's. The forecaster is fed it (every tick) and the reactive
   and fit terms read it. Why: a 5 s window's arrivals are noise (Azure x14: single ticks at
   80-130 rps where ~70-80 arrive) and the scale-down windows hold each spike. Not the
   default: with it and `floor_hold_s` 90 Azure spent 14 % fewer GPU-hours (1.628 vs 1.894)
   at -0.2 points, but the diurnal day lost its first ramp's minute (99.17 %: the mean's lag)
   and Mooncake's decode flapped (benchmarks/results/AUTOSCALE.md, Round 4).
1. **Predictive floor** (`autoscale.predictive_floor.PredictiveFloor`, which owns the
   forecaster and its feed, and documents each of its options: the trend projection and its
   cap, `trend_age`, `release_after_ticks`, `decode_residence_mean`,
   `decode_correction_on_target`, `cold_start_growth`, `ramp_epsilon`, the cold-start spare,
   fixed or learnt) from the forecaster's load at now and at `startup_s` ahead (the larger
   need wins, so capacity is asked for before the load arrives and not released before it
   leaves), sized by `autoscale.sizing` with `headroom` (0.9) and the pool's correction `k`:
   `N_p = ceil(rate·ISL·(1-hit) / (C_p(ISL_u, TTFT)·h/k_p))`,
   `N_d = ceil(rate·(T_own + OSL·ITL) / (B_d(ISL+OSL/2, ITL)·h/k_d))`, `T_own` = the model's
   prefill time of the uncached prompt capped at the TTFT target (prefill queueing is not
   decode residence).
2. **Correction** `k` = EWMA (`correction_alpha` 0.2) of observed/predicted mean latency
   (`planner_terms.prefill_correction` / `decode_correction`), clamped to
   `correction_bounds` (0.5, 2.0), updated only from windows with ≥ `min_samples` (20) requests
   whose pool neither breached its target nor had replicas pending (a short pool's latency
   measures its shortage, not the model).
3. **Reactive term** (`planner_terms.reactive_term`): queue / concurrency / KV needs of the
   observed load (step 0), and +1 on an observed percentile breach unless replicas are pending
   (with `decode_wait_attribution`, on by default since Round 14, a TTFT breach while
   sequences wait for a decode slot goes to decode when prefill's own queue would serve in
   time: Round 10). The prefill queue term projects the backlog to when a cold start ordered
   now would serve (`startup_s`; step 7 sizes moved replicas on `switch_s`).
4. `raw = max(floor, reactive)` clamped to the pool's [min, max].
5. **Stabilization**: going up takes the minimum recommendation of the last `scale_up_s`
   (0: at once); going down takes the maximum of the last `scale_down_s` and happens only
   once the planner has watched a whole window, and only to the smallest count `M` at which
   the observed load spread over `M` replicas still meets the SLO with `margin` (0.8)
   (`planner_terms.fits`, the consolidation check). **Sooner** (`sustained-fit`): each tick
   records `c = ` the smallest count in `[raw, provisioned]` that the observed load fits
   with `margin` (provisioned when none does, or while the target is breached); the pool
   may go down to the largest `c` of the last `fast_down_s` (60 s), but not below the
   largest floor for the load *now* of the last `floor_hold_s` (default `scale_down_s`) nor
   the largest floor for the load `startup_s` *ahead* of the last `ahead_hold_s` (default:
   `floor_hold_s`; 0: this tick's; a projection released by `release_after_ticks` no longer
   holds), without waiting the window: N-k that kept meeting
   the SLO for a minute, at or above every raw need of that minute (the floor for the load
   ahead is part of the raw need, so it is held for the fit minute) and every floor for the
   load now of the window. With `decode_fit_as_floor` (off by default) the decode fit check
   is the floor's own model on the observed load (`planner_terms.decode_floor_need` with
   `margin` as the headroom). Why the two options: holding the 120 s-ahead floors for the whole
   180 s window was the largest single excess over the oracle on the Azure prefix (~0.50 of
   pdorch's 0.92 GPU-h above it: a projection of the ramp, or of the noisy level, outlived the
   time it forecast by 60 s); and the observed-sequences decode check counts sequences at the
   step time the current replicas run (6 ms there, not the 50 ms target), so it allowed counts
   the floor then refused and decode flapped (benchmarks/results/AUTOSCALE.md, Rounds 4 and 5).
   Not the defaults: with both, Azure -3.9 % and diurnal -8.9 % GPU-h at the same attainment, but
   Mooncake -0.40 points (92.65 %) and 3/3 direction changes where main makes 1/1 (Round 5).
   With `prefill_floor_hold_s` (off by default: it flapped prefill on the whole Azure hour)
   the prefill pool's fast way down holds its floors that long only, once the level has
   fallen 25 % from its peak of the last `floor_hold_s` (`autoscale.prefill_release`,
   Round 13). `prefill_scale_down_s` (prefill's own window, 90 s since Round 16),
   `prefill_fall_release` and `prefill_fit_margin` (off): `autoscale.prefill_down`.
   `reversal_budget` (per pool, off): a reversing down waits for room in the budget
   (`autoscale.reversal_budget`, Round 16).
   (The backlog and breach terms' high-water mark is what the fast path skips.)
   **Hysteresis** (`hysteresis` h, `hysteresis_window_s` 600): within the window after a move,
   its reversal reads the predictive floor's need widened by h (down to `ceil(need·(1+h))`
   after an up, up past `ceil(need/(1+h))` after a down), so a need that hovers at a count's
   edge does not order and release a cold start every minute (`autoscale.stabilization`,
   which holds this step's state and rules; reason `hysteresis` when it holds an up).
   **Persistence** (`reversal_ticks` N, default 6; 1: off): within that
   window after a down, an up the predictive floor alone orders (the reactive count is at or
   below the current one) waits until its up count has been above the current count N ticks
   in a row (reason `persistence`): the 2-hour day's up-reversals were each a projection
   1-4 ticks long.
6. **Budget** and 7. **Role switch**: the two steps that couple the pools
   (`autoscale.cross_pool`, which documents them): the GPU budget split by marginal SLO gain,
   and moving a replica between the pools instead of a cold start.

`reasons[pool]` names the binding term (`ttft-throughput`, `itl-concurrency`, `cold-start-spare`
(the floor ahead is the need now plus the spare: `autoscale.spare`), `ttft-queue`,
`itl-concurrency-observed`, `kv-usage`, `ttft-breach`, `itl-breach[-pending]`, `min`, `max`,
`stabilization`, `consolidation`, `hysteresis`, `persistence`, `reversal-budget`, `budget`,
`role-move`, `role-return`, `role-loan`); `details`
carries the inputs (`details["role_moves"]`: each pool's slack, shortage now, arriving moves and
loan).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from autoscale.cross_pool import CrossPoolSteps
from autoscale.decision import ScaleDecision
from autoscale.forecast_seam import EwmaForecaster, Forecaster, PredictorForecaster, SlidingLoad
from autoscale.load_window import LoadWindow
from autoscale.perf_model_base import PerfModel
from autoscale.planner_base import Planner, register_planner
from autoscale.planner_terms import (
    Term,
    decode_correction,
    fits,
    observed_breach,
    prefill_correction,
    reactive_term,
)
from autoscale.policy import DEFAULT_COLD_START_SPARE, PrefillSignal, SloPolicy
from autoscale.predictive_floor import POOLS, PredictiveFloor
from autoscale.prefill_down import PrefillDown, prefill_windows
from autoscale.projections import AheadRelease, TrendAge
from autoscale.residence import ResidenceMean
from autoscale.reversal_budget import budgets_of
from autoscale.role_moves import PoolView
from autoscale.signals import Observation, Pool
from autoscale.sizing import clamp_to_limits
from autoscale.spare import DEFAULT_LEARNT_SPARE, LearntSpareOptions, SpareMode
from autoscale.stabilization import PoolStabilizer, Windows


class PdorchPlanner(Planner):
    """See the module docstring; options are keyword arguments of the factory."""

    name = "pdorch"

    def __init__(
        self,
        policy: SloPolicy,
        perf_model: PerfModel,
        *,
        forecaster: Forecaster | None = None,
        stand_in: bool = True,
        headroom: float = 0.9,
        margin: float = 0.8,
        kv_high: float = 0.9,
        min_samples: int = 20,
        correction_alpha: float = 0.2,
        correction_bounds: tuple[float, float] = (0.5, 2.0),
        forecast_window_s: float | None = None,
        trend_cap: float = 1.5,
        trend_hold_s: float = 30.0,
        fast_down_s: float = 60.0,
        level_window_s: float | None = None,
        floor_hold_s: float | None = None,
        ahead_hold_s: float | None = None,
        decode_fit_as_floor: bool = False,
        trend_age: bool = False,
        release_after_ticks: int = 0,
        decode_residence_mean: bool = False,
        decode_correction_on_target: bool = False,
        hysteresis: float = 0.1,
        hysteresis_window_s: float = 600.0,
        budget_margin: float = 0.2,
        reversal_ticks: int = 6,
        decode_wait_attribution: bool = True,
        cold_start_growth: dict[Pool, float] | None = None,
        cold_start_spare: Mapping[Pool, float] | None = DEFAULT_COLD_START_SPARE,
        cold_start_spare_until_s: float | None = None,
        cold_start_spare_mode: SpareMode | str = SpareMode.LEARNT,
        cold_start_spare_learnt: LearntSpareOptions | Mapping[str, Any] = DEFAULT_LEARNT_SPARE,
        move_stabilization: bool = False,
        budget_keep_fleet: bool = True,
        move_release_check: bool = False,
        ramp_epsilon: float = 0.0,
        prefill_floor_hold_s: float | None = None,
        budget_now_first: bool = True,
        prefill_scale_down_s: float | None = 90.0,
        prefill_fall_release: bool = False,
        prefill_fit_margin: float | None = None,
        reversal_budget: Mapping[Pool, Any] | None = None,
    ) -> None:
        self.policy = policy
        self.perf = perf_model
        # the prefill consolidation check's own margin (`autoscale.prefill_down`; None: margin)
        self.prefill_fit_margin = margin if prefill_fit_margin is None else prefill_fit_margin
        # a TTFT breach while sequences wait for a decode slot is decode's (`planner_terms`)
        self.decode_wait_attribution = decode_wait_attribution
        self.headroom = headroom
        self.margin = margin
        self.kv_high = kv_high
        self.min_samples = min_samples
        self.correction_alpha = correction_alpha
        self.correction_bounds = correction_bounds
        self.interval_s = policy.intervals.reactive_s
        # default 0: every tick (60 s aggregates cut the Azure floor's GPU-hours 8 % but cost
        # the 600 s diurnal day 25 points of attainment: its ramps outrun a 60 s window)
        self.forecast_window_s = 0.0 if forecast_window_s is None else forecast_window_s
        self.trend_cap = trend_cap
        self.trend_hold_s = trend_hold_s
        self.fast_down_s = fast_down_s
        # default 0 (each window as it is); `LEVEL_WINDOWS` x the tick is the measured option:
        # Azure -1 % GPU-h alone, and the diurnal day's first ramp ordered later (Round 4)
        self.level_window_s = 0.0 if level_window_s is None else level_window_s
        # default: the whole `scale_down_s` window (90 s cut Azure's GPU-hours 9 % but let
        # Mooncake's decode flap 3 <-> 4 seven times: benchmarks/results/AUTOSCALE.md, Round 4)
        self.floor_hold_s = (
            policy.stabilization.scale_down_s if floor_hold_s is None else floor_hold_s
        )
        # how long a floor sized for the load `startup_s` ahead bounds the fast way down
        # (default None: as long as `floor_hold_s`; 0: the tick's own, held for the fit minute
        # through the raw need: Round 5's measured option, not a default: Mooncake lost 0.4 pt)
        self.ahead_hold_s = self.floor_hold_s if ahead_hold_s is None else ahead_hold_s
        # True: the decode fit check is the floor's model (module docstring, step 5); False
        # (default): the observed-sequences check of `planner_terms.fits`
        self.decode_fit_as_floor = decode_fit_as_floor
        # `autoscale.projections`: damp the projected growth by how long the trend has lasted
        # (rule 1) and release a projection whose load has not come after `release_after_ticks`
        # ticks below its path (rule 2); both off by default (Round 6)
        self._trend_age = TrendAge() if trend_age else None
        self._release = (
            AheadRelease(release_after_ticks, self.ahead_hold_s) if release_after_ticks else None
        )
        # the decode floor's need over the last residence time (`autoscale.residence`), and
        # the decode correction on the ITL target, not the KV-capped batch (`sizing`); both
        # off by default: with them Mooncake's floor asks the oracle's ~4 decode replicas, but
        # the shared budget then starves prefill (-0.5 points there, -0.46 on diurnal: Round 7)
        self.decode_correction_on_target = decode_correction_on_target
        self._level = SlidingLoad(self.level_window_s)
        # a reversal within `hysteresis_window_s` of a move reads the floor's need widened by
        # `hysteresis` (`autoscale.stabilization`)
        self.hysteresis = hysteresis
        st = policy.stabilization
        windows = Windows(
            st.scale_up_s, st.scale_down_s, fast_down_s, self.floor_hold_s, self.ahead_hold_s
        )
        # and a floor-ordered up within it after a down waits `reversal_ticks` ticks in a row;
        # prefill may have its own scale-down window (`autoscale.prefill_down`)
        own = {Pool.PREFILL: prefill_windows(windows, prefill_scale_down_s)}
        self._stabilizers = {
            p: PoolStabilizer(own.get(p, windows), hysteresis_window_s, reversal_ticks)
            for p in POOLS
        }
        for p, b in budgets_of(reversal_budget).items():  # `autoscale.reversal_budget`
            self._stabilizers[p].budget = b
        # steps 0-1: the forecaster and the floor sized from it (`autoscale.predictive_floor`)
        self.floor = PredictiveFloor(
            policy,
            perf_model,
            forecaster or EwmaForecaster(),
            headroom=headroom,
            forecast_window_s=self.forecast_window_s,
            trend_cap=trend_cap,
            trend_hold_s=trend_hold_s,
            hysteresis=hysteresis,
            trend_age=self._trend_age,
            release=self._release,
            residence=ResidenceMean() if decode_residence_mean else None,
            decode_correction_on_target=decode_correction_on_target,
            growth={Pool(p): g for p, g in (cold_start_growth or {}).items()},
            ramp_epsilon=ramp_epsilon,
            spare={Pool(p): x for p, x in (cold_start_spare or {}).items()},
            spare_until_s=cold_start_spare_until_s,
            # `learnt`: the spare measured from the floor's need (`autoscale.spare`)
            spare_learnt=(
                LearntSpareOptions.model_validate(cold_start_spare_learnt)
                if SpareMode(cold_start_spare_mode) is SpareMode.LEARNT
                else None
            ),
        )
        # the prefill pool's shorter hold of its floors after a peak (`autoscale.prefill_release`)
        # and its release of the floors ahead on a sustained fall (`autoscale.prefill_down`)
        self._prefill_down = PrefillDown.of(
            prefill_floor_hold_s, self.floor_hold_s, prefill_fall_release, trend_hold_s
        )
        self.correction: dict[Pool, float] = {p: 1.0 for p in POOLS}
        self._floor: dict[Pool, Term] = {}
        self._floor_at: float | None = None
        self._started: float | None = None
        # steps 6-7, the budget and role moves (`autoscale.cross_pool`)
        self.move_stabilization = move_stabilization
        # a move's giver clears its own way down too (rule (a) of move stabilization alone)
        self.move_release_check = move_release_check or move_stabilization
        self.cross = CrossPoolSteps(
            policy,
            self._stabilizers,
            budget_margin=budget_margin,
            stand_in=stand_in,
            move_stabilization=move_stabilization,
            hysteresis_window_s=hysteresis_window_s,
            budget_keep_fleet=budget_keep_fleet,
            move_release_check=move_release_check,
            budget_now_first=budget_now_first,
        )

    @property
    def forecaster(self) -> Forecaster:
        """The floor's forecaster (`autoscale.predictive_floor`)."""
        return self.floor.forecaster

    # -- terms -------------------------------------------------------------------------
    def _update_corrections(self, obs: Observation) -> None:
        lo, hi = self.correction_bounds
        for pool, raw in (
            (
                Pool.PREFILL,
                prefill_correction(
                    self.perf,
                    obs,
                    self.min_samples,
                    self.decode_wait_attribution,
                    leg=self.policy.perf_model.online_prefill_signal is PrefillSignal.PREFILL_LEG,
                ),
            ),
            (Pool.DECODE, decode_correction(self.perf, obs, self.min_samples)),
        ):
            # a window whose tail breaches the target is explained by a queue (often one
            # inherited from an earlier window), not by the model: learning from it doubled the
            # prefill floor for minutes after the Azure trace's opening ramp
            if raw is None or observed_breach(obs, pool, self.policy, self.min_samples) is not None:
                continue
            # nor from a window of a pool the planner already found short (replicas pending):
            # on Azure's opening ramp one such window (1 ready, 2 pending, TTFT queued behind
            # the clumps) set k_p to the 2.0 bound, where it stayed for 150 s of breached
            # windows and doubled the floor; the steady state later learnt k_p ~ 0.8
            if obs.pool(pool).pending > 0:
                continue
            k = self.correction[pool]
            self.correction[pool] = min(hi, max(lo, k + self.correction_alpha * (raw - k)))

    def _fits(self, obs: Observation, pool: Pool, m: int) -> bool:
        return fits(
            self.perf,
            self.policy,
            obs,
            pool,
            m,
            self.correction[pool],
            margin=self.margin if pool is Pool.DECODE else self.prefill_fit_margin,
            min_samples=self.min_samples,
            kv_high=self.kv_high,
            decode_as_floor=self.decode_fit_as_floor,
            decode_on_target=self.decode_correction_on_target,
        )

    def _consolidated(self, obs: Observation, pool: Pool, start: int, current: int) -> int:
        """Smallest m in [start, current] at which the observed load fits (else current)."""
        m = start
        while m < current and not self._fits(obs, pool, m):
            m += 1
        return m

    def _arrival_s(self, obs: Observation, pool: Pool) -> float:
        """How soon a replica the pool's own count asks for serves: its `startup_s`, role moves
        on or not. A move's `switch_s` sizes only the moved replicas (`_role_moves`): sizing
        the cold starts on a 5 s arrival ordered a 5 s drain's worth of them."""
        return self.policy.limits(pool).startup_s

    # -- plan ------------------------------------------------------------------------------
    def plan(self, observation: Observation) -> ScaleDecision:
        obs = observation
        now = obs.now
        if self._started is None:
            self._started = now
        # the load of the last `level_window_s` (`forecast_seam.SlidingLoad`): the floor's
        # forecaster input (when fed every tick) and what the reactive and fit terms read
        view = self._level.add(obs)
        fed = self.floor.feed(view if self.forecast_window_s <= 0 else obs)
        self._update_corrections(obs)
        if (
            self._floor_at is None
            or fed
            or not self.floor.fed
            or now - self._floor_at >= self.policy.intervals.predictive_s
        ):
            self._floor = self.floor.compute(obs, self.correction)
            self._floor_at = now
        desired: dict[Pool, int] = {}
        reasons: dict[Pool, str] = {}
        details: dict[str, Any] = {"correction": {str(p): k for p, k in self.correction.items()}}
        details.update(self._prefill_down.apply(now, self.floor, self._stabilizers[Pool.PREFILL]))
        now_need: dict[Pool, int] = {}  # the need for the load now (`budget_now_first`)
        # the reactive and fit terms read the load as the last `level_window_s`' mean (the
        # pools, queues and latencies of this window): a one-tick spike of arrivals is not a
        # steady need; a real burst shows up in the queue, which is read as it is
        for pool in POOLS:
            floor = self._floor[pool]
            react = reactive_term(
                self.perf,
                self.policy,
                view,
                pool,
                self.correction[pool],
                min_samples=self.min_samples,
                kv_high=self.kv_high,
                start_s=self._arrival_s(obs, pool),
                decode_on_target=self.decode_correction_on_target,
                decode_wait=self.decode_wait_attribution,
            )
            term = react if react.replicas > floor.replicas else floor
            stabilizer = self._stabilizers[pool]
            counts = self.floor.counts[pool]
            stabilizer.record_floor(
                now,
                (self._clamped(pool, counts.raw_now), self._clamped(pool, counts.now)),
                (self._clamped(pool, floor.replicas), self._clamped(pool, counts.hold)),
                self.floor.projection[pool],
            )
            n, bound = clamp_to_limits(self.policy, pool, term.replicas)
            hold = self._clamped(pool, max(react.replicas, counts.hold))
            up = self._clamped(pool, max(react.replicas, counts.up))
            desired[pool], reasons[pool] = stabilizer.decide(
                now,
                n,
                hold,
                bound or term.reason,
                view.pool(pool).provisioned,
                now - self._started,
                partial(self._consolidated, view, pool),
                up,
                self._clamped(pool, react.replicas),
            )
            now_need[pool] = self._clamped(pool, max(react.replicas, counts.raw_now))
            details[str(pool)] = {
                "floor": floor.replicas,
                "floor_inputs": floor.inputs,
                "reactive": react.replicas,
                "reactive_reason": react.reason,
                "reactive_inputs": react.inputs,
                "raw": n,
                "ready": obs.pool(pool).ready,
                "pending": obs.pool(pool).pending,
                "draining": obs.pool(pool).draining,
            }
        provisioned = {p: obs.pool(p).provisioned for p in POOLS}
        self.cross.apply_budget(desired, reasons, provisioned, now_need)
        moves = self.cross.role_moves(now, partial(self._pool_view, obs), desired, reasons, details)
        return ScaleDecision(now, desired, reasons, moves, details)

    def start_fleet(self, window: LoadWindow, fleet: dict[Pool, int]) -> dict[Pool, int]:
        """The fleet at t = 0 the harness's `fleet` becomes with `cold_start_spare`
        (`PredictiveFloor.start_fleet`); unchanged without it."""
        return self.floor.start_fleet(window, fleet)

    def _clamped(self, pool: Pool, n: int) -> int:
        return clamp_to_limits(self.policy, pool, n)[0]

    def _pool_view(self, obs: Observation, pool: Pool, desired: int) -> PoolView:
        """What the move rules read of one pool (`autoscale.role_moves.PoolView`)."""
        status = obs.pool(pool)
        limits = self.policy.limits(pool)
        k = self.correction[pool]
        terms = [
            reactive_term(
                self.perf,
                self.policy,
                obs,
                pool,
                k,
                min_samples=self.min_samples,
                kv_high=self.kv_high,
                start_s=start,
                decode_on_target=self.decode_correction_on_target,
                decode_wait=self.decode_wait_attribution,
            ).replicas
            for start in (limits.startup_s, self.policy.switch_s)
        ]
        now, urgent = terms
        ahead = self._floor[pool].replicas
        start = max(1, min(max(ahead, now, limits.min), status.ready))
        keep = self._consolidated(obs, pool, start, status.ready) if status.ready else 0
        return PoolView(
            ready=status.ready,
            pending=status.pending,
            desired=desired,
            ahead=ahead,
            now=now,
            urgent=urgent,
            keep=keep,
            minimum=limits.min,
            maximum=limits.max,
            breach=observed_breach(obs, pool, self.policy, self.min_samples) is not None,
            # move stabilization's giver check: the floor's widened need, and the count the
            # pool's own way down would hold it at now (a move out is a way down)
            hold=max(
                self._clamped(pool, self.floor.counts[pool].hold),
                self._stabilizers[pool].down_limit(obs.now) if self.move_release_check else 0,
            ),
        )


def _make_pdorch(policy: SloPolicy, perf_model: PerfModel, **options: Any) -> PdorchPlanner:
    """The registry's factory (what `pdorch bench autoscale`, `pdorch autoscale` and the
    in-process autoscaler build): the policy's `planner:` options (`policy.PlannerOptions`),
    then keyword `options` over them; the policy's predictor (`PredictorForecaster(
    policy.predictor, policy.predictor_params, request_weighted_isl=True)`) is the default
    forecaster; `forecaster=` overrides it."""
    merged: dict[str, Any] = {**policy.planner.model_dump(), **options}
    merged.setdefault(
        "forecaster",
        PredictorForecaster(policy.predictor, policy.predictor_params, request_weighted_isl=True),
    )
    return PdorchPlanner(policy, perf_model, **merged)


register_planner("pdorch", _make_pdorch)
