"""The what-if simulator: dynamic membership in virtual time and planners driving it."""

from __future__ import annotations

import json
import random
from typing import Any

from typer.testing import CliRunner

from autoscale.forecast_seam import PredictorForecaster
from autoscale.perf_model import build_perf_model
from autoscale.planners import planner_factory
from autoscale.policy import SloPolicy, load_policy
from autoscale.signals import Pool
from benchmarks.autoscale_sim.flaps import direction_change_times, worst_window_direction_changes
from benchmarks.autoscale_sim.observe import ObservationBuilder
from benchmarks.autoscale_sim.result import direction_changes
from benchmarks.autoscale_sim.runner import AutoscaleSimConfig, run_planner, trace_requests
from benchmarks.fleet_sim import FleetSpec, SimConfig
from benchmarks.fleet_sim.membership import DynamicFleetSimulator
from benchmarks.workloads.model import Segment, SessionSpec, TurnSpec, Workload
from pdorch.cli import app
from tests.data import AZURE_CONVERSATION, REPO, require_file

POLICY = REPO / "deploy" / "examples" / "slo-policy.yaml"


def phases(spec: list[tuple[int, float, int, int]], seed: int = 0) -> Workload:
    """Open-loop single-turn requests: per phase (count, rate rps, prompt, output tokens)."""
    rng = random.Random(seed)
    sessions = []
    t = 0.0
    for k, (n, rate, isl, osl) in enumerate(spec):
        for i in range(n):
            t += rng.expovariate(rate)
            prompt = [
                Segment(rng.getrandbits(60), max(16, isl + rng.randint(-isl // 10, isl // 10)))
            ]
            sessions.append(
                SessionSpec(f"r{k}-{i}", t, [TurnSpec(prompt, osl)], carry_context=False)
            )
    return Workload("phases", sessions)


def small_policy(**changes: Any) -> SloPolicy:
    """The example policy with short cold starts and scale-down windows (a fast test)."""
    pol = load_policy(POLICY)
    pools = {
        p: lim.model_copy(update={"startup_s": 10.0, "max": 8}) for p, lim in pol.pools.items()
    }
    stab = pol.stabilization.model_copy(update={"scale_down_s": 30.0})
    return pol.model_copy(update={"pools": pools, "stabilization": stab, **changes})


def loaded(n: int = 300, rate: float = 6.0) -> Workload:
    return phases([(n, rate, 1500, 200)])


# ---------------------------------------------------------------- membership


def test_drain_under_load_loses_nothing_and_routes_nothing_new_to_the_leaver() -> None:
    wl = loaded()

    def ctl(sim: DynamicFleetSimulator, now: float) -> None:
        if now == 10.0:
            sim.drain_replica("d1", now, 300.0)
            sim.drain_replica("p1", now, 300.0)
            assert sim.status("decode") == (1, 0, 1)

    sim = DynamicFleetSimulator(
        wl, SimConfig(FleetSpec.parse("2P2D")), controller=ctl, control_interval_s=0.5
    )
    res = sim.run_dynamic()
    assert res.arrived == res.completed == wl.num_requests and res.lost == 0
    removed = {e.replica_id: e.t_s for e in res.events if e.kind == "removed"}
    assert set(removed) == {"d1", "p1"}
    assert removed["d1"] > 10.0  # it had in-flight work: finished it first
    d1_jobs = [r for r in res.sim.requests if r.decode_replica == "d1"]
    assert d1_jobs and all(r.arrival <= 10.0 for r in d1_jobs)
    assert all(r.finish is not None and r.finish <= removed["d1"] + 1e-9 for r in d1_jobs)
    assert all(r.arrival <= 10.0 for r in res.sim.requests if r.prefill_replica == "p1")
    assert sim.status("decode") == (1, 0, 0) and sim.status("prefill") == (1, 0, 0)


def test_added_replica_is_pending_until_startup_then_serves() -> None:
    wl = loaded()
    seen: dict[float, tuple[int, int, int]] = {}

    def ctl(sim: DynamicFleetSimulator, now: float) -> None:
        if now == 5.0:
            assert sim.add_replica("decode", now, 8.0) == "d1"
        if now in (5.0, 12.5, 13.0):
            seen[now] = sim.status("decode")

    sim = DynamicFleetSimulator(
        wl, SimConfig(FleetSpec.parse("1P1D")), controller=ctl, control_interval_s=0.5
    )
    res = sim.run_dynamic()
    assert seen == {5.0: (1, 1, 0), 12.5: (1, 1, 0), 13.0: (2, 0, 0)}
    served = [r.arrival for r in res.sim.requests if r.decode_replica == "d1"]
    assert served and min(served) >= 13.0
    assert res.lost == 0 and res.completed == wl.num_requests
    # paid from the ask: d1 from 5 s, the others from 0
    gpu = sim.gpu_seconds(res.end_s, {})
    assert abs(gpu["decode"] - (res.end_s + res.end_s - 5.0)) < 1e-6


def test_role_switch_moves_a_replica_that_then_serves_the_other_role() -> None:
    wl = loaded()
    seen: dict[str, Any] = {}

    def ctl(sim: DynamicFleetSimulator, now: float) -> None:
        if now == 10.0:
            sim.switch_role("p1", now, 5.0, 300.0)
            seen["during"] = (sim.status("prefill"), sim.status("decode"))

    sim = DynamicFleetSimulator(
        wl, SimConfig(FleetSpec.parse("2P1D")), controller=ctl, control_interval_s=0.5
    )
    res = sim.run_dynamic()
    # moving: no longer ready in prefill, pending in decode
    assert seen["during"] == ((1, 0, 0), (1, 1, 0))
    moved = next(e for e in res.events if e.kind == "moved")
    assert moved.replica_id == "p1" and moved.pool == "decode" and moved.t_s >= 15.0
    as_decode = [r for r in res.sim.requests if r.decode_replica == "p1"]
    assert as_decode and all(r.arrival >= moved.t_s for r in as_decode)
    assert all(r.arrival <= 10.0 for r in res.sim.requests if r.prefill_replica == "p1")
    assert res.lost == 0 and res.completed == wl.num_requests


def test_drain_timeout_aborts_and_counts_the_rest_as_lost() -> None:
    wl = phases([(200, 20.0, 1000, 600)])

    def ctl(sim: DynamicFleetSimulator, now: float) -> None:
        if now == 5.0:
            sim.drain_replica("d0", now, 1.0)

    sim = DynamicFleetSimulator(
        wl, SimConfig(FleetSpec.parse("1P2D")), controller=ctl, control_interval_s=0.5
    )
    res = sim.run_dynamic()
    assert res.lost > 0
    assert res.arrived == res.completed + res.lost == wl.num_requests


def test_fast_forward_equals_stepping_with_membership_changes() -> None:
    wl = phases([(150, 8.0, 800, 300)])

    def ctl(sim: DynamicFleetSimulator, now: float) -> None:
        if now == 4.0:
            sim.add_replica("decode", now, 3.0)
        if now == 9.0:
            sim.drain_replica("d0", now, 300.0)
        if now == 12.0:
            sim.switch_role("p1", now, 2.0, 300.0)

    runs = []
    for ff in (True, False):
        cfg = SimConfig(FleetSpec.parse("2P2D"), fast_forward=ff)
        runs.append(DynamicFleetSimulator(wl, cfg, controller=ctl, control_interval_s=0.5))
    fast, slow = (s.run_dynamic() for s in runs)
    assert fast.sim.num_fast_forward_steps > 0 and slow.sim.num_fast_forward_steps == 0
    assert fast.sim.requests == slow.sim.requests
    assert [(e.t_s, e.replica_id, e.kind) for e in fast.events] == [
        (e.t_s, e.replica_id, e.kind) for e in slow.events
    ]


# ---------------------------------------------------------------- planners


def prompts_then_outputs() -> Workload:
    return phases(
        [
            (60, 2.0, 1000, 100),  # warm-up, 30 s
            (500, 10.0, 7000, 20),  # long prompts, 50 s
            (60, 2.0, 1000, 100),
            (900, 15.0, 300, 1200),  # long outputs, 60 s
            (300, 1.0, 1000, 100),  # quiet tail, 300 s
        ]
    )


def run_prompts_then_outputs(pol: SloPolicy) -> dict[str, Any]:
    wl = prompts_then_outputs()
    # phases of 30-60 s are shorter than the forecaster's 60 s window: feed it every tick
    fast = {"pdorch": {"forecast_window_s": 0.0}}
    cfg = AutoscaleSimConfig(initial={Pool.PREFILL: 1, Pool.DECODE: 1}, planner_options=fast)
    r = run_planner(wl, pol, "pdorch", cfg)
    assert r["lost"] == 0 and r["completed"] == r["requests"] == wl.num_requests
    return r


def mean_decode_policy() -> SloPolicy:
    """`small_policy` with the decode model and planner options before Round 14: the mean
    decode residence, no decode spare, no decode-wait attribution (decode then moves only for
    the outputs, which is what the test below follows phase by phase)."""
    pol = small_policy()
    perf = pol.perf_model.model_copy(
        update={"decode_burst_queue": False, "decode_burst_dispersion_online": False}
    )
    plan = pol.planner.model_copy(
        update={"cold_start_spare": None, "decode_wait_attribution": False}
    )
    return pol.model_copy(update={"perf_model": perf, "planner": plan})


def test_pdorch_with_the_shipped_policy_holds_each_phase_then_comes_down() -> None:
    # Round 14's defaults size decode for bursts and keep a decode spare, so decode is already
    # up before the long outputs arrive: check what each phase is served with, not the events
    r = run_prompts_then_outputs(small_policy())

    def provisioned(pool: str, t0: float, t1: float) -> list[int]:
        return [
            int(row[pool]["ready"] + row[pool]["pending"])
            for row in r["timeline"]
            if t0 <= row["t_s"] <= t1
        ]

    assert max(provisioned("prefill", 30, 80)) >= 3  # the long prompts
    assert min(provisioned("decode", 100, 150)) >= 3  # the long outputs
    end = r["timeline"][-1]
    assert end["prefill"]["ready"] < max(provisioned("prefill", 30, 80))
    assert end["decode"]["ready"] < min(provisioned("decode", 100, 150))


def test_pdorch_scales_prefill_for_long_prompts_decode_for_long_outputs_then_down() -> None:
    wl = prompts_then_outputs()
    r = run_prompts_then_outputs(mean_decode_policy())
    assert r["lost"] == 0 and r["completed"] == r["requests"] == wl.num_requests
    timeline = r["timeline"]

    def prov(row: dict[str, Any], pool: str) -> int:
        return int(row[pool]["ready"] + row[pool]["pending"])

    ups = [e for e in r["events"] if e["kind"] == "scale" and e["to"] > e["from"]]
    downs = [e for e in r["events"] if e["kind"] == "scale" and e["to"] < e["from"]]
    # long prompts (30-80 s): prefill grows to several replicas
    assert any(e["pool"] == "prefill" and 30 <= e["t_s"] <= 80 and e["to"] >= 3 for e in ups)
    # long outputs (~90-150 s): decode grows, prefill does not
    assert any(e["pool"] == "decode" and 90 <= e["t_s"] <= 150 and e["to"] >= 3 for e in ups)
    assert not any(e["pool"] == "prefill" and 90 <= e["t_s"] <= 150 for e in ups)
    # the quiet tail: both come back down
    assert any(e["pool"] == "prefill" and e["t_s"] >= 80 for e in downs)  # after the prompts
    assert any(e["pool"] == "decode" and e["t_s"] >= 140 for e in downs)  # after the outputs
    end = timeline[-1]
    peak = {p: max(prov(row, p) for row in timeline) for p in ("prefill", "decode")}
    assert prov(end, "prefill") < peak["prefill"] and prov(end, "decode") < peak["decode"]
    assert r["gpu_hours"] > 0 and 0 < r["attainment"]["both"] <= 1


def test_oracle_and_static_planners_run_with_nothing_lost() -> None:
    # a 75 s burst of long prompts: long enough for the oracle's 60 s window to see it
    wl = phases([(100, 3.0, 1000, 100), (900, 12.0, 4000, 100), (100, 3.0, 1000, 100)])
    pol = small_policy()
    requests = trace_requests(wl, 64)
    assert len(requests) == wl.num_requests and requests[0][1] > 0
    out = {
        name: run_planner(wl, pol, name, requests=requests)
        for name in ("oracle", "static-peak", "static-mean")
    }
    for name, r in out.items():
        assert r["lost"] == 0 and r["completed"] == wl.num_requests, name
    assert out["static-peak"]["events"] == [] and out["static-mean"]["events"] == []
    assert out["static-peak"]["gpu_hours"] >= out["static-mean"]["gpu_hours"]
    # the oracle's replicas start instantly: it scales up for the burst within one tick
    ups = [e for e in out["oracle"]["events"] if e["pool"] == "prefill" and e["to"] > e["from"]]
    assert ups
    assert all(row["prefill"]["pending"] == 0 for row in out["oracle"]["timeline"])


def test_role_moves_land_in_the_other_pool_with_role_switching_on() -> None:
    wl = phases([(100, 4.0, 6000, 20), (600, 15.0, 300, 800), (100, 2.0, 500, 50)])
    pol = small_policy(role_switching=True)
    # prefill keeps its slack (no scale-down within the run) so a move is the cheap way out
    pol = pol.model_copy(
        update={"stabilization": pol.stabilization.model_copy(update={"scale_down_s": 600.0})}
    )
    cfg = AutoscaleSimConfig(initial={Pool.PREFILL: 4, Pool.DECODE: 1})
    r = run_planner(wl, pol, "pdorch", cfg)
    moves = [e for e in r["events"] if e["kind"] == "move"]
    assert moves and moves[0]["pool"] == "decode"
    # the giver's side of the move is logged too (a direction change of both pools)
    gave = moves[1]
    assert (gave["pool"], gave["t_s"]) == ("prefill", moves[0]["t_s"])
    assert gave["from"] - gave["to"] == moves[0]["to"] - moves[0]["from"]
    assert gave["reason"].endswith("to decode")
    n = moves[0]["to"]
    # the moved replicas serve decode within switch_s (+ their drain), no cold start
    t_ready = min(row["t_s"] for row in r["timeline"] if row["decode"]["ready"] >= n)
    assert t_ready - moves[0]["t_s"] <= pol.switch_s + 10.0
    # the move comes first; prefill keeps what its floor needs, so decode may cold-start the
    # rest, never before the move
    cold = [e for e in r["events"] if e["kind"] == "scale" and e["pool"] == "decode"]
    assert all(e["t_s"] >= moves[0]["t_s"] for e in cold)
    assert r["time_to_capacity_by_pool_s"]["prefill"] == []
    assert r["lost"] == 0 and r["completed"] == wl.num_requests


def test_direction_changes_count_sign_flips_of_nonzero_steps() -> None:
    assert direction_changes([1, 1, 2, 3, 3, 2, 2, 4, 1]) == 3
    assert direction_changes([2, 2, 2]) == 0
    assert direction_changes([1, 3, 5]) == 0


def test_registry_gives_pdorch_and_dynamo_the_policys_predictor() -> None:
    pol = small_policy()
    for name in ("pdorch", "dynamo-planner"):
        planner = planner_factory(name)(pol, build_perf_model(pol))
        fc = getattr(planner, "forecaster", None)  # pdorch's and dynamo's planners both have one
        assert isinstance(fc, PredictorForecaster) and fc.inner.kind == pol.predictor


def test_cli_json_object_per_planner() -> None:
    trace = require_file(AZURE_CONVERSATION)
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "autoscale",
            "--trace",
            str(trace),
            "--trace-format",
            "azure",
            "--max-requests",
            "150",
            "--planners",
            "static-peak,oracle",
            "--policy",
            str(POLICY),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data["planners"]) == {"static-peak", "oracle"}
    for row in data["planners"].values():
        assert 0 <= row["attainment"] <= 1 and row["gpu_hours"] > 0 and row["lost"] == 0
        assert set(row["direction_changes"]) == {"prefill", "decode"}


def test_cli_rate_mode_overlay_multiplies_requests_compress_shortens() -> None:
    trace = require_file(AZURE_CONVERSATION)
    base = ["bench", "autoscale", "--trace", str(trace), "--trace-format", "azure"]
    base += ["--max-requests", "60", "--rate-scale", "2", "--planners", "static-peak"]
    base += ["--policy", str(POLICY), "--json"]
    over = CliRunner().invoke(app, base)
    comp = CliRunner().invoke(app, [*base, "--rate-mode", "compress"])
    assert over.exit_code == 0 and comp.exit_code == 0, over.output + comp.output
    assert json.loads(over.stdout)["planners"]["static-peak"]["requests"] == 120
    assert json.loads(comp.stdout)["planners"]["static-peak"]["requests"] == 60
    bad = CliRunner().invoke(app, [*base, "--rate-mode", "stretch"])
    assert bad.exit_code != 0


def test_observation_window_counts_arrivals_latencies_and_replica_signals() -> None:
    wl = loaded(n=200, rate=8.0)
    seen: list[Any] = []

    def ctl(sim: DynamicFleetSimulator, now: float) -> None:
        if not seen:
            seen.append(ObservationBuilder(sim, 2.0, 0.05))
        if now in (10.0, 15.0):
            seen.append(seen[0].observe(now))

    sim = DynamicFleetSimulator(
        wl, SimConfig(FleetSpec.parse("1P2D")), controller=ctl, control_interval_s=0.5
    )
    sim.run_dynamic()
    first, second = seen[1], seen[2]
    assert first.window_s == 10.0 and second.window_s == 5.0
    arrivals = [r.arrival for r in sim.all_records]
    assert first.num_requests == sum(1 for t in arrivals if t <= 10.0)
    assert second.num_requests == sum(1 for t in arrivals if 10.0 < t <= 15.0)
    assert abs(second.arrival_rps - second.num_requests / 5.0) < 1e-9
    assert 1300 < second.mean_isl_tokens < 1700 and second.mean_osl_tokens == 200
    assert second.ttft.count > 0 and second.ttft.p50_s <= second.ttft.p99_s
    assert second.itl.count > 0 and second.slo_attainment is not None
    assert second.pools[Pool.DECODE].ready == 2 and second.pools[Pool.PREFILL].ready == 1
    decode = second.replicas_of(Pool.DECODE)
    assert len(decode) == 2 and sum(r.num_running for r in decode) > 0
    busy = [r for r in decode if r.num_running > 0]
    assert all(r.mean_step_s is not None and r.decode_kv_tokens > 0 for r in busy)
    assert all(r.kv_capacity_tokens > 0 and 0 < r.kv_usage < 1 for r in busy)


def test_planner_run_is_the_same_with_and_without_fast_forward() -> None:
    # the control ticks read the engines mid-run: they must see the same state either way
    wl = phases([(60, 2.0, 1000, 100), (300, 10.0, 5000, 20), (400, 12.0, 300, 600)])
    pol = small_policy(role_switching=True)
    init = {Pool.PREFILL: 1, Pool.DECODE: 1}
    fast, slow = (
        run_planner(
            wl,
            pol,
            "pdorch",
            AutoscaleSimConfig(
                fast_forward=ff,
                initial=init,
                planner_options={"pdorch": {"forecast_window_s": 0.0}},  # short phases
            ),
        )
        for ff in (True, False)
    )
    assert fast["events"] and any(e["kind"] == "move" for e in fast["events"])
    for key in ("events", "timeline", "attainment", "gpu_hours", "direction_changes"):
        assert fast[key] == slow[key], key


def test_role_switching_override_reaches_the_planner() -> None:
    wl = phases([(100, 4.0, 6000, 20), (600, 15.0, 300, 800)])
    pol = small_policy(role_switching=False)
    pol = pol.model_copy(
        update={"stabilization": pol.stabilization.model_copy(update={"scale_down_s": 600.0})}
    )
    init = {Pool.PREFILL: 4, Pool.DECODE: 1}
    on = run_planner(wl, pol, "pdorch", AutoscaleSimConfig(initial=init, role_switching=True))
    off = run_planner(wl, pol, "pdorch", AutoscaleSimConfig(initial=init))
    assert on["role_switching"] and not off["role_switching"]
    assert any(e["kind"] == "move" for e in on["events"])
    assert not any(e["kind"] == "move" for e in off["events"])


def test_worst_window_direction_changes_counts_flips_in_any_600_s_window() -> None:
    def ev(t: float, pool: str, a: int, b: int) -> dict[str, Any]:
        return {"t_s": t, "pool": pool, "from": a, "to": b, "reason": "", "kind": "scale"}

    events = [
        ev(0, "decode", 2, 3),
        ev(100, "decode", 3, 2),  # flip at 100
        ev(150, "prefill", 1, 2),  # other pool: not counted for decode
        ev(650, "decode", 2, 3),  # flip at 650
        ev(690, "decode", 3, 3),  # no change: ignored
        ev(700, "decode", 3, 2),  # flip at 700
        ev(1400, "decode", 2, 1),  # same sign: no flip
    ]
    assert direction_change_times(events, "decode") == [100.0, 650.0, 700.0]
    # 600 s windows from each flip: [100, 700) holds 2, [650, 1250) holds 2; 601 s reach 700
    assert worst_window_direction_changes(events, "decode") == 2
    assert worst_window_direction_changes(events, "decode", window_s=601) == 3
    assert worst_window_direction_changes(events, "prefill") == 0
    assert worst_window_direction_changes([], "decode") == 0
