"""`planner.cold_start_spare_mode: learnt` (`autoscale/spare.py`): the spare is the recent growth
of the floor's need within one cold start, on hand-computed need series (S = `startup_s` 120 s,
one point per 5 s tick), its policy fields, and the planner's floor with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscale.policy import PolicyError, SloPolicy, load_policy
from autoscale.signals import Pool
from autoscale.spare import LearntSpare, LearntSpareOptions, SpareMode, quantile
from tests.autoscale.obs import observation
from tests.autoscale.test_planner import planner
from tests.autoscale.test_policy import ROOT

D = Pool.DECODE


def spare(
    *,
    prior: float = 0.0,
    window_s: float = 1200.0,
    q: float = 0.95,
    cap: float = 3.0,
    prior_s: float = 0.0,
) -> LearntSpare:
    opts = LearntSpareOptions(window_s=window_s, quantile=q, cap=cap, prior_s=prior_s)
    return LearntSpare(120.0, prior, opts)


def feed(s: LearntSpare, needs: list[float], start: float = 0.0) -> list[float]:
    return [s.observe(start + 5.0 * i, n) for i, n in enumerate(needs)]


def test_quantile_is_linear_between_order_statistics() -> None:
    assert quantile([], 0.95) == 0.0
    assert quantile([3.0], 0.5) == 3.0
    # 0, 1, 2, 3, 4 at q 0.95: position 3.8 -> 3 + 0.8
    assert quantile([4.0, 0.0, 2.0, 1.0, 3.0], 0.95) == pytest.approx(3.8)


def test_a_flat_need_learns_no_spare() -> None:
    assert feed(spare(), [2.4] * 100)[-1] == 0.0


def test_a_falling_need_learns_no_spare() -> None:
    assert feed(spare(), [5.0 - 0.04 * i for i in range(100)])[-1] == 0.0


def test_a_step_of_two_within_a_cold_start_learns_two() -> None:
    # 1.0 for 200 s, then 3.0: every τ in [80 s, 195 s] sees need(τ + 120) - need(τ) = 2;
    # that is 24 of the 72 growths by t = 475 s, above the 5 % tail, so the spare is 2
    values = feed(spare(), [1.0] * 40 + [3.0] * 56)
    assert values[23] == 0.0  # t = 115 s: no point has reached τ + S yet
    assert values[-1] == pytest.approx(2.0)
    # the growth of one cold start is what it adds, not where it goes: 10 -> 12 is also 2
    assert feed(spare(), [10.0] * 40 + [12.0] * 56)[-1] == pytest.approx(2.0)


def test_a_step_leaves_the_spare_once_its_growths_are_older_than_the_window() -> None:
    # window 300 s: the step's growths complete at 200-315 s (τ + S), so from t = 620 s on
    # (315 + 300 < t) no growth of it is left and the spare is 0 again
    s = spare(window_s=300.0)
    values = feed(s, [1.0] * 40 + [3.0] * 100)
    assert values[int(600 / 5)] == pytest.approx(2.0)  # t = 600 s: still within the window
    assert values[int(625 / 5)] == 0.0


def test_the_cap_bounds_a_jump() -> None:
    assert feed(spare(cap=1.25), [1.0] * 40 + [6.0] * 56)[-1] == pytest.approx(1.25)


def test_the_quantile_reads_the_tail_not_one_outlier() -> None:
    # one tick of +4 among 200 flat ticks is one growth in ~180: below q 0.95's tail
    needs = [1.0] * 100 + [5.0] + [1.0] * 100
    assert feed(spare(), needs)[-1] == 0.0
    assert feed(spare(q=1.0, cap=16.0), needs)[-1] == pytest.approx(4.0)


def test_the_prior_is_a_minimum_for_the_first_prior_s() -> None:
    values = feed(spare(prior=1.5, prior_s=300.0), [2.0] * 100)
    assert values[0] == 1.5 and values[59] == 1.5  # t = 295 s
    assert values[60] == 0.0  # t = 300 s: the flat need's growth
    # a repeated or older tick changes nothing
    s = spare(prior=1.5, prior_s=300.0)
    feed(s, [2.0] * 61)
    assert s.observe(10.0, 9.0) == 0.0 and s.value() == 0.0


def test_the_policy_selects_and_checks_the_learnt_spare(tmp_path: Path) -> None:
    # learnt is the default since Round 15's whole runs; fixed is selected by name
    assert SloPolicy().planner.cold_start_spare_mode is SpareMode.LEARNT
    assert SloPolicy().planner.cold_start_spare_learnt == LearntSpareOptions()
    assert load_policy(
        "planner:\n  cold_start_spare_mode: fixed\n"
    ).planner.cold_start_spare_mode is (SpareMode.FIXED)
    text = (
        "planner:\n  cold_start_spare_mode: learnt\n"
        "  cold_start_spare_learnt: {window_s: 900, quantile: 0.99, cap: 2}\n"
    )
    good = load_policy(text)
    assert good.planner.cold_start_spare_mode is SpareMode.LEARNT
    assert good.planner.cold_start_spare_learnt == LearntSpareOptions(
        window_s=900.0, quantile=0.99, cap=2.0
    )
    learnt = "planner.cold_start_spare_learnt"
    for bad, field in (
        ("  cold_start_spare_mode: sometimes\n", "planner.cold_start_spare_mode"),
        ("  cold_start_spare_learnt: {quantile: 1.5}\n", f"{learnt}.quantile"),
        ("  cold_start_spare_learnt: {window_s: 0}\n", f"{learnt}.window_s"),
        ("  cold_start_spare_learnt: {cap: 17}\n", f"{learnt}.cap"),
        ("  cold_start_spare_learnt: {q: 0.9}\n", f"{learnt}.q"),
    ):
        path = tmp_path / "p.yaml"
        path.write_text("planner:\n" + bad, encoding="utf-8")
        with pytest.raises(PolicyError) as err:
            load_policy(path)
        assert [(i.path, i.line) for i in err.value.issues] == [(field, 2)]


def test_the_planner_drops_a_learnt_spare_on_a_steady_load_and_keeps_the_fixed_one() -> None:
    # 9 rps, 1000 + 200 tokens: decode 0.909 now; a spare of 1 asks 2 (`test_cold_start_spare`)
    def run(mode: str) -> list[tuple[int, str]]:
        pl = planner(
            cold_start_spare={"decode": 1.0},
            cold_start_spare_mode=mode,
            cold_start_spare_learnt={"prior_s": 60.0},
        )
        out = []
        for i in range(1, 40):
            d = pl.plan(observation(now=5.0 * i, rate=9.0, p=(2, 0), d=(1, 0)))
            out.append((d.desired[D], d.reasons[D]))
        return out

    fixed, learnt = run("fixed"), run("learnt")
    assert set(fixed) == {(2, "cold-start-spare")}
    # the prior (1) holds the first 60 s, then the flat load has grown by nothing
    assert learnt[0] == (2, "cold-start-spare") and learnt[10] == (2, "cold-start-spare")
    assert set(learnt[12:]) == {(1, "itl-concurrency")}


def test_the_planner_keeps_a_learnt_spare_where_the_need_jumped_within_a_cold_start() -> None:
    # 9 rps (0.909) for 150 s, then 27 rps (2.727): growths of 1.818 from t = 155 + 120 s on;
    # a while after the jump, at 27 rps: 2.727 + 1.818 = 4.545 -> 5 decode, the spare's
    pl = planner(
        cold_start_spare={"decode": 1.0},
        cold_start_spare_mode="learnt",
        cold_start_spare_learnt={"prior_s": 0.0},
    )
    d = None
    for i in range(1, 80):
        rate = 9.0 if i <= 30 else 27.0
        d = pl.plan(observation(now=5.0 * i, rate=rate, p=(4, 0), d=(3, 0)))
    assert d is not None
    assert d.desired[D] == 5 and d.reasons[D] == "cold-start-spare"
    assert d.details["decode"]["floor_inputs"]["spare"] == pytest.approx(1.818, abs=1e-3)


def test_a_zero_prior_learns_from_the_first_tick_and_an_unnamed_pool_has_no_spare() -> None:
    # `{decode: 0}` in learnt mode: no prior, so a flat 9 rps plans its plain 1 decode at once;
    # prefill, not named, gets no learnt spare at all
    pl = planner(cold_start_spare={"decode": 0.0}, cold_start_spare_mode="learnt")
    assert set(pl.floor.learnt) == {D}
    d = pl.plan(observation(now=5.0, rate=9.0, p=(2, 0), d=(1, 0)))
    assert d.desired[D] == 1 and d.reasons[D] == "itl-concurrency"


def test_smoothing_reads_the_need_through_tick_noise() -> None:
    # a need repeating 1, 3, 1, 3, 3 per 5 s tick is flat on average; raw, 2 in 5 of its
    # growths over 120 s (24 ticks) are +2; its mean over the last 25 s (5 ticks) is 2.2 on
    # every tick from the fifth, so past the first ticks' partial means it grows by nothing
    needs = [1.0, 3.0, 1.0, 3.0, 3.0] * 40
    assert feed(spare(), needs)[-1] == pytest.approx(2.0)
    smooth = LearntSpare(120.0, 0.0, LearntSpareOptions(smooth_s=25.0, prior_s=0.0))
    assert feed(smooth, needs)[-1] == pytest.approx(0.0)


def test_the_live_examples_small_steady_decode_pool_learns_no_spare() -> None:
    # the live example (Qwen3-32B on A100, 30 s cold starts, pools of 1-3) in learnt mode with
    # no prior: a steady 2 rps holds its plain decode count, no standing spare replica
    from autoscale.perf_model import build_perf_model
    from autoscale.planner import PdorchPlanner
    from autoscale.planner_base import planner_factory

    live = load_policy(ROOT / "deploy" / "examples" / "slo-policy-live.yaml")
    pol = live.model_copy(
        update={
            "planner": live.planner.model_copy(
                update={
                    "cold_start_spare": {D: 0.0},
                    "cold_start_spare_mode": SpareMode.LEARNT,
                }
            )
        }
    )
    pl = planner_factory("pdorch")(pol, build_perf_model(pol))
    assert isinstance(pl, PdorchPlanner)
    needs, spares = [], []
    for i in range(1, 61):
        d = pl.plan(observation(now=5.0 * i, rate=2.0, p=(1, 0), d=(1, 0)))
        needs.append(d.details["decode"]["floor_inputs"]["need"])
        spares.append(pl.floor.learnt[D].value())
    assert 0.0 < needs[-1] < 3.0  # a small pool
    assert max(spares[12:]) < 0.05  # ~0 once the first cold start's growths are read
