"""The what-if runner's start fleet (`benchmarks/autoscale_sim/runner.initial_fleet`): pdorch
with `planner.cold_start_spare` raises its own start from the shared one; every other start is
unchanged."""

from __future__ import annotations

from autoscale.decision import ScaleDecision
from autoscale.load_window import LoadWindow
from autoscale.planner_base import Planner
from autoscale.policy import SloPolicy
from autoscale.signals import Observation, Pool
from benchmarks.autoscale_sim.runner import StartsFleet, initial_fleet, make_planner

P, D = Pool.PREFILL, Pool.DECODE
# 20 rps of 1000-token prompts and 250-token answers for a minute: one replica per pool
# holds it (the shared start, the oracle's first 30 s)
REQUESTS = [(i / 20.0, 1000, 250, 0.0) for i in range(1200)]


# the hand-computed counts below read the mean decode model (the default before Round 14)
MEAN_DECODE = {"decode_burst_queue": False, "decode_burst_dispersion_online": False}


def start(
    options: dict[str, object], name: str = "pdorch", pol: SloPolicy | None = None
) -> dict[Pool, int]:
    pol = pol or SloPolicy.model_validate({"perf_model": MEAN_DECODE})
    planner, _ = make_planner(name, pol, REQUESTS, options)
    return initial_fleet(name, planner, pol, REQUESTS)


def test_shared_start_without_a_spare() -> None:
    shared = start({}, "oracle")
    assert start({"cold_start_spare": None}) == shared
    assert shared[D] == 1


def test_the_shipped_policy_starts_pdorch_with_its_decode_spare() -> None:
    # Round 14's defaults: the burst decode model and a 1.5-replica decode spare
    shipped = SloPolicy()
    shared = start({}, "oracle", shipped)
    assert start({}, pol=shipped)[D] > shared[D]
    assert start({"cold_start_spare": None}, pol=shipped) == shared


def test_a_decode_spare_adds_to_pdorchs_start_only() -> None:
    # pdorch's decode floor need at 20 rps (default model, headroom 0.9) is in (0.9, 1]:
    # `ceil(need + s)` is 2 at s = 0.1 and 3 at s = 1.5, above the shared 1; prefill as shared
    shared = start({}, "oracle")
    assert start({"cold_start_spare": {"decode": 0.1}}) == {P: shared[P], D: 2}
    assert start({"cold_start_spare": {"decode": 1.5}}) == {P: shared[P], D: 3}
    assert start({"cold_start_spare": {"prefill": 1.0}})[D] == shared[D]


def test_only_a_planner_with_start_fleet_is_asked() -> None:
    pol = SloPolicy()
    pdorch, _ = make_planner("pdorch", pol, REQUESTS, {})
    oracle, _ = make_planner("oracle", pol, REQUESTS, {})
    assert isinstance(pdorch, StartsFleet)
    assert not isinstance(oracle, StartsFleet)


class _Raises(Planner):
    """A planner with a start of its own (not pdorch): the runner must call it."""

    def plan(self, observation: Observation) -> ScaleDecision:
        raise AssertionError("initial_fleet does not plan a non-static planner")

    def start_fleet(self, window: LoadWindow, fleet: dict[Pool, int]) -> dict[Pool, int]:
        assert window.arrival_rps == 20.0  # the first window's load, not an empty one
        return {P: fleet[P] + 2, D: fleet[D] + 1}


def test_a_start_fleet_method_raises_the_shared_start() -> None:
    pol = SloPolicy()
    shared = start({}, "oracle")
    planner = _Raises()
    assert isinstance(planner, StartsFleet)
    assert initial_fleet("custom", planner, pol, REQUESTS) == {P: shared[P] + 2, D: shared[D] + 1}
