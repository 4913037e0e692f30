"""Hysteresis on a pool's reversals (`autoscale.stabilization`), alone and inside the planner."""

from __future__ import annotations

import pytest

from autoscale.policy import Intervals
from autoscale.signals import Pool
from autoscale.stabilization import PoolStabilizer, Windows, hold_count, up_count
from tests.autoscale.obs import observation, policy
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
