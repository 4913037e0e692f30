"""Hysteresis on a pool's reversals and the persistence of a floor-ordered reversal
(`autoscale.stabilization`), alone and inside the planner."""

from __future__ import annotations

import pytest

from autoscale.policy import Intervals
from autoscale.signals import Pool
from autoscale.stabilization import PoolStabilizer, Windows, hold_count, up_count
from tests.autoscale.obs import observation, policy, replicas
from tests.autoscale.test_planner import planner

P, D = Pool.PREFILL, Pool.DECODE
H = 0.1


def fits_from_start(start: int, current: int) -> int:
    """A consolidation check that every count passes: the windows alone decide."""
    return start


def stabilizer(window_s: float = 600.0) -> PoolStabilizer:
    return PoolStabilizer(Windows(0.0, 60.0, 0.0, 60.0, 60.0), window_s)


def tick(st: PoolStabilizer, t: float, need: float, current: int) -> tuple[int, str]:
    """One tick whose only term is a floor need `need`."""
    raw, hold, up = hold_count(need, 0.0), hold_count(need, H), up_count(need, H)
    return st.decide(t, raw, hold, "itl", current, t, fits_from_start, up)


def test_counts_of_one_need() -> None:
    assert (hold_count(4.9, 0.0), hold_count(4.9, H), hold_count(4.5, H)) == (5, 6, 5)
    assert hold_count(5.0, 0.0) == 5  # no float hair adds a replica
    assert (up_count(5.2, H), up_count(5.6, H)) == (5, 6)


def test_after_an_up_the_way_down_must_clear_the_widened_need() -> None:
    st = stabilizer()
    assert tick(st, 0.0, 5.9, 5) == (6, "itl")  # up at once: no down to reverse
    # need 4.8: raw 5 but hold ceil(5.28) = 6: the reversal waits
    assert {tick(st, float(t), 4.8, 6)[0] for t in range(5, 125, 5)} == {6}
    # need 4.5 (hold 5) for a whole window: down to 5
    downs = [tick(st, float(t), 4.5, 6)[0] for t in range(125, 250, 5)]
    assert downs[0] == 6 and downs[-1] == 5


def test_after_a_down_the_way_up_must_pass_the_widened_need() -> None:
    st = stabilizer()
    downs = [tick(st, float(t), 3.5, 5)[0] for t in range(0, 70, 5)]
    assert downs[-1] == 4  # down once the window has passed; no up to reverse
    assert tick(st, 70.0, 4.3, 4) == (4, "hysteresis")  # up count ceil(3.91) = 4
    assert tick(st, 75.0, 4.5, 4) == (5, "itl")  # ceil(4.09) = 5: a real rise
    # a need far over the band goes straight to the raw count
    st2 = stabilizer()
    [tick(st2, float(t), 3.5, 5) for t in range(0, 70, 5)]
    assert tick(st2, 70.0, 6.2, 4) == (7, "itl")


def test_outside_the_window_each_way_reads_the_raw_count() -> None:
    st = stabilizer(window_s=100.0)
    assert tick(st, 0.0, 5.9, 5)[0] == 6
    assert st.banded(100.0) and not st.banded(100.5)
    at, t_down = 6, None
    for t in range(5, 200, 5):
        n, _ = tick(st, float(t), 4.8, at)
        if n < at:
            t_down = float(t)
        at = n
    assert t_down == 105.0  # the window ended at 100 s; the raw window (60 s) allowed it
    assert tick(st, t_down + 50.0, 5.2, 5) == (5, "hysteresis")  # within 100 s: held
    assert tick(st, t_down + 150.0, 5.2, 5) == (6, "itl")  # after: the raw count


@pytest.mark.parametrize(("h", "settled"), [(0.0, 2), (H, 3)])
def test_planner_keeps_a_replica_it_just_added_while_the_need_sits_under_the_edge(
    h: float, settled: int
) -> None:
    # decode: rate x (0.1 s own prefill + 200 x 0.05 s) sequences over 100 per replica, so
    # 20.8 rps needs 2.10 replicas (up from 2 to 3) and 19.3 rps 1.95 (raw 2); within the
    # window after that up the way down needs 2 / 1.1 = 1.82 or less (`margin` 1: the
    # consolidation check is out of the way)
    pl = planner(
        policy(down_s=60.0, intervals=Intervals(predictive_s=5.0)), hysteresis=h, margin=1.0
    )

    def run(rate: float, ticks: range, n: int) -> list[int]:
        return [
            pl.plan(observation(float(t), rate=rate, p=(3, 0), d=(n, 0))).desired[D] for t in ticks
        ]

    assert run(20.8, range(0, 5, 5), 2) == [3]
    assert run(19.3, range(5, 100, 5), 3)[-1] == settled
    if h:  # 17.8 rps: need 1.80, hold ceil(1.98) = 2: down to 2 with hysteresis too
        assert run(17.8, range(100, 175, 5), 3)[-1] == 2


def test_planner_hysteresis_does_not_slow_a_first_up() -> None:
    for h in (0.0, H):
        pl = planner(policy(down_s=60.0), hysteresis=h)
        # 24.4 rps x 1000 / 8k = 3.05: raw 4 from 3 at once
        d = pl.plan(observation(0.0, rate=24.4, p=(3, 0)))
        assert d.desired[P] == 4 and d.reasons[P] == "ttft-throughput"


# -- persistence of a floor-ordered reversal (`reversal_ticks`) ---------------------------


def went_down(n: int = 3, window_s: float = 600.0) -> PoolStabilizer:
    """A stabilizer whose pool went 5 -> 4 at 60 s (need 3.5 for a whole 60 s window)."""
    st = PoolStabilizer(Windows(0.0, 60.0, 0.0, 60.0, 60.0), window_s, reversal_ticks=n)
    downs = [tick(st, float(t), 3.5, 5)[0] for t in range(0, 65, 5)]
    assert downs[-1] == 4 and downs[-2] == 5
    return st


def floor_tick(
    st: PoolStabilizer, t: float, need: float, current: int, reactive: int = 1
) -> tuple[int, str]:
    """One tick of a floor need `need` beside a reactive count `reactive`."""
    raw = max(reactive, hold_count(need, 0.0))
    hold, up = max(reactive, hold_count(need, H)), max(reactive, up_count(need, H))
    return st.decide(t, raw, hold, "itl", current, t, fits_from_start, up, reactive)


def test_a_floor_ordered_up_after_a_down_waits_for_n_ticks_in_a_row() -> None:
    st = went_down(n=3)
    # need 4.5: up count ceil(4.09) = 5 > 4, so hysteresis lets it pass; the 3rd tick orders
    assert [floor_tick(st, t, 4.5, 4) for t in (65.0, 70.0)] == [(4, "persistence")] * 2
    assert floor_tick(st, 75.0, 4.5, 4) == (5, "itl")


def test_a_tick_back_under_the_band_starts_the_count_again() -> None:
    st = went_down(n=3)
    assert floor_tick(st, 65.0, 4.5, 4) == (4, "persistence")
    assert floor_tick(st, 70.0, 4.5, 4) == (4, "persistence")
    assert floor_tick(st, 75.0, 4.3, 4) == (4, "hysteresis")  # up count ceil(3.91) = 4
    assert floor_tick(st, 80.0, 4.5, 4) == (4, "persistence")  # 1 in a row again
    assert floor_tick(st, 85.0, 4.5, 4) == (4, "persistence")
    assert floor_tick(st, 90.0, 4.5, 4) == (5, "itl")


def test_an_up_the_reactive_terms_ask_for_goes_at_once() -> None:
    st = went_down(n=3)
    # an observed need of 5 (queue, concurrency, KV or a breach) is no forecast noise
    assert floor_tick(st, 65.0, 4.5, 4, reactive=5) == (5, "itl")
    # without a reactive count (None) nothing waits: the old rule
    st2 = went_down(n=3)
    assert st2.decide(65.0, 5, 5, "itl", 4, 65.0, fits_from_start, 5) == (5, "itl")


def test_no_wait_for_an_up_that_continues_an_up_nor_outside_the_window() -> None:
    st = went_down(n=2)
    assert floor_tick(st, 65.0, 4.5, 4) == (4, "persistence")
    assert floor_tick(st, 70.0, 4.5, 4) == (5, "itl")
    # the pool's last move is now an up: a further up is no reversal
    assert floor_tick(st, 75.0, 5.6, 5) == (6, "itl")  # up count ceil(5.09) = 6
    # 100 s window: at 170 s the down (60 s) is 110 s old: no band, no wait
    st3 = went_down(n=3, window_s=100.0)
    assert floor_tick(st3, 170.0, 4.2, 4) == (5, "itl")


def test_one_tick_is_the_rule_without_persistence() -> None:
    st = went_down(n=1)
    assert floor_tick(st, 65.0, 4.5, 4) == (5, "itl")


@pytest.mark.parametrize("n", [1, 3])
def test_planner_waits_for_a_floor_spike_after_a_down_but_not_for_a_lasting_rise(n: int) -> None:
    # decode: 17.8 rps x (0.1 + 200 x 0.05) s / 100 = 1.80 (raw 2, hold ceil(1.98) = 2);
    # 25 rps: 2.525 (up count ceil(2.30) = 3 > 2); the replicas run 20 sequences each, so
    # the observed concurrency asks for 1 (`margin` 1: the consolidation check passes)
    pl = planner(
        policy(down_s=60.0, intervals=Intervals(predictive_s=5.0)),
        hysteresis=H,
        margin=1.0,
        reversal_ticks=n,
    )
    at = 3

    def step(t: float, rate: float) -> tuple[int, str]:
        nonlocal at
        reps = replicas(D, at, num_running=20)
        d = pl.plan(observation(t, rate=rate, p=(4, 0), d=(at, 0), reps=reps))
        at = d.desired[D]
        return at, d.reasons[D]

    for t in range(0, 100, 5):
        step(float(t), 17.8)
    assert at == 2
    # a two-tick spike: with 3 ticks in a row it orders nothing
    spike = [step(100.0 + 5 * k, 25.0) for k in range(2)]
    back = step(110.0, 17.8)
    if n == 1:
        assert spike[0] == (3, "itl-concurrency")
        return
    assert spike == [(2, "persistence")] * 2 and back[0] == 2
    # a lasting rise orders on its 3rd tick
    rise = [step(115.0 + 5 * k, 25.0) for k in range(3)]
    assert [r[0] for r in rise] == [2, 2, 3]
