"""The way down's hysteresis (`autoscale.stabilization`), on its own and inside the planner."""

from __future__ import annotations

import pytest

from autoscale.policy import Intervals
from autoscale.signals import Pool
from autoscale.stabilization import PoolStabilizer, Windows, hold_count
from tests.autoscale.obs import observation, policy
from tests.autoscale.test_planner import planner

P, D = Pool.PREFILL, Pool.DECODE


def fits_from_start(start: int, current: int) -> int:
    """A consolidation check that every count passes: the windows alone decide."""
    return start


def stabilizer(down_s: float = 60.0) -> PoolStabilizer:
    return PoolStabilizer(Windows(0.0, down_s, 0.0, down_s, down_s))


def test_hold_count_is_the_need_widened_by_the_band() -> None:
    assert hold_count(4.9, 0.0) == 5
    assert hold_count(4.9, 0.1) == 6  # 5.39
    assert hold_count(4.5, 0.1) == 5  # 4.95
    assert hold_count(5.0, 0.0) == 5  # no float hair adds a replica


def test_the_way_down_reads_the_hold_count_and_the_way_up_the_raw_one() -> None:
    st = stabilizer()
    # at 6 replicas with the need at 4.8: raw 5, hold ceil(5.28) = 6, so the pool stays at 6
    for t in range(0, 125, 5):
        n, why = st.decide(float(t), 5, hold_count(4.8, 0.1), "itl", 6, float(t), fits_from_start)
        assert n == 6, (t, n, why)
    # the need falls to 4.5 (hold 5): one whole window later the pool goes to 5
    downs = [
        st.decide(float(t), 5, hold_count(4.5, 0.1), "itl", 6, float(t), fits_from_start)[0]
        for t in range(125, 250, 5)
    ]
    assert downs[-1] == 5 and 6 in downs  # it waited the window
    # the way up is the raw count at once, band or not
    assert st.decide(250.0, 6, hold_count(5.1, 0.1), "itl", 5, 250.0, fits_from_start) == (
        6,
        "itl",
    )


def test_the_band_holds_only_within_its_window_after_the_pool_went_up() -> None:
    st = PoolStabilizer(Windows(0.0, 60.0, 0.0, 60.0, 60.0), band_window_s=100.0)
    assert not st.banded(0.0)  # never went up: the way down reads the raw counts
    assert st.decide(0.0, 6, 6, "itl", 5, 0.0, fits_from_start) == (6, "itl")
    assert st.banded(100.0) and not st.banded(100.5)
    # after the window, need 4.8 (raw 5, hold 6) comes down to 5 once the raw window allows
    downs = [
        st.decide(float(t), 5, hold_count(4.8, 0.1), "itl", 6, float(t), fits_from_start)[0]
        for t in range(5, 200, 5)
    ]
    assert downs[:19] == [6] * 19 and downs[-1] == 5


@pytest.mark.parametrize(("band", "settled"), [(0.0, 2), (0.1, 3)])
def test_planner_holds_a_replica_while_the_need_sits_just_under_a_count(
    band: float, settled: int
) -> None:
    # decode: 19.3 rps x (0.1 s own prefill + 200 x 0.05 s) = 194.9 sequences over 100 per
    # replica = 1.95 replicas (raw 2); with a 10 % band the way down needs 2 / 1.1 = 1.82 or
    # less, so 3 replicas stay (`margin` 1: the consolidation check is out of the way)
    pl = planner(
        policy(down_s=60.0, intervals=Intervals(predictive_s=5.0)), down_band=band, margin=1.0
    )

    def run(rate: float, ticks: range) -> list[int]:
        return [
            pl.plan(observation(float(t), rate=rate, p=(3, 0), d=(3, 0))).desired[D] for t in ticks
        ]

    first = run(19.3, range(0, 95, 5))
    assert first[0] == 3 and first[-1] == settled
    if band:  # 17.8 rps: need 1.80, hold ceil(1.98) = 2: down to 2 with the band too
        assert run(17.8, range(95, 170, 5))[-1] == 2


def test_planner_band_does_not_slow_the_way_up() -> None:
    for band in (0.0, 0.1):
        pl = planner(policy(down_s=60.0), down_band=band)
        # 24.4 rps x 1000 / 8k = 3.05: raw 4 from 3 at once
        d = pl.plan(observation(0.0, rate=24.4, p=(3, 0)))
        assert d.desired[P] == 4 and d.reasons[P] == "ttft-throughput"
