"""The budget split with the load now first (`autoscale.budget`, `budget_now_first`), by hand."""

from __future__ import annotations

from autoscale.budget import split_budget
from autoscale.cross_pool import CrossPoolSteps
from autoscale.signals import Pool
from autoscale.stabilization import PoolStabilizer, Windows
from tests.autoscale.obs import policy

P, D = Pool.PREFILL, Pool.DECODE
MINS = {P: 1, D: 1}
GPUS = {P: 1, D: 1}


def test_single_tier_split_equalises_wants_including_headroom() -> None:
    # P wants 10 (all of it for the load now), D wants 14 (4 now, 10 of growth headroom):
    # the one-tier estimate n_p/10 x n_d/14 is largest where n_p·n_d is, at 8 + 8 (0.457;
    # 7 + 9: 0.450, 10 + 6: 0.429), so prefill is 2 short for the load it has now
    assert split_budget({P: 10, D: 14}, MINS, GPUS, 16) == {P: 8, D: 8}


def test_now_first_serves_the_load_now_then_splits_the_rest() -> None:
    # tier 1: the needs now, 10 + 4 = 14 <= 16, both served; tier 2: 2 more GPUs towards
    # the wants from (10, 4): P is at its want, so both go to D
    got = split_budget({P: 10, D: 14}, MINS, GPUS, 16, now={P: 10, D: 4})
    assert got == {P: 10, D: 6}


def test_now_first_splits_the_now_needs_when_they_alone_exceed_the_budget() -> None:
    # the needs now (12 + 8 = 20) do not fit 16: tier 1 is the marginal split of the now
    # needs alone (n_p·n_d largest at 8 + 8: 8/12 x 8/8 = 0.667; 9 + 7: 0.656), and D's
    # growth headroom (its want 14) gets nothing
    got = split_budget({P: 12, D: 14}, MINS, GPUS, 16, now={P: 12, D: 8})
    assert got == {P: 8, D: 8} == split_budget({P: 12, D: 8}, MINS, GPUS, 16)


def test_now_needs_are_clamped_to_min_and_want() -> None:
    # a now need above the want (stabilization held the want lower) counts as the want;
    # below the minimum as the minimum
    got = split_budget({P: 6, D: 14}, {P: 2, D: 1}, GPUS, 10, now={P: 9, D: 0})
    # tier 1: P 6 (its want), D 1 (its minimum); tier 2: the last 3 GPUs to D
    assert got == {P: 6, D: 4}


def test_a_kept_split_must_serve_the_now_needs_within_the_margin() -> None:
    want, now = {P: 10, D: 14}, {P: 10, D: 4}
    kept = {P: 8, D: 8}
    # over the wants the fresh (10, 6) estimates 1.0 x 6/14 = 0.43 < kept's 0.8 x 8/14 =
    # 0.46: the one-tier rule keeps it; over the now needs fresh gains 1.0 - 0.8 = 0.2,
    # so it is kept at margin 0.2 and replaced at 0.1
    assert split_budget(want, MINS, GPUS, 16, kept, margin=0.2) == kept
    assert split_budget(want, MINS, GPUS, 16, kept, margin=0.2, now=now) == kept
    assert split_budget(want, MINS, GPUS, 16, kept, margin=0.1, now=now) == {P: 10, D: 6}


def test_budget_fits_wants_unchanged() -> None:
    assert split_budget({P: 5, D: 6}, MINS, GPUS, 16, now={P: 5, D: 2}) == {P: 5, D: 6}


def test_cross_pool_passes_now_needs_only_when_on() -> None:
    pol = policy(budget=16)
    stabilizers = {p: PoolStabilizer(Windows(0.0, 60.0, 0.0, 60.0, 60.0), 600.0) for p in (P, D)}

    def cut(on: bool) -> dict[Pool, int]:
        steps = CrossPoolSteps(
            pol,
            stabilizers,
            budget_margin=0.2,
            stand_in=True,
            move_stabilization=False,
            hysteresis_window_s=600.0,
            budget_now_first=on,
        )
        desired, reasons = {P: 10, D: 14}, {P: "ttft-throughput", D: "itl-concurrency"}
        steps.apply_budget(desired, reasons, {P: 1, D: 1}, {P: 10, D: 4})
        return desired

    assert cut(False) == {P: 8, D: 8}
    assert cut(True) == {P: 10, D: 6}
