"""The what-if control loop: one planner over one workload on the dynamic fleet simulator.

    run = run_planner(workload, policy, "pdorch", AutoscaleSimConfig())

Every metrics tick (`tick_s`, 0.5 s) the controller checks two clocks:

- the planner's: every `planner.interval_s` it builds an `Observation` (`observe.py`, window =
  since the planner's previous tick), feeds the perf model's online fit (`observe`, when the
  model has one), calls `plan` and hands the decision to the `SimActuator`;
- the recorder's: every `record_s` (10 s) one timeline sample (`result.py`).

Start: every planner starts from the same fleet, the one the oracle's window-mean sizing
(`OraclePlanner.mean_need`) gives the first `oracle.interval_s` of the trace (clamped to the
pools' limits), ready at t = 0 (a fleet sized
for the load before the trace began); `initial=` overrides it. A planner's first tick is at
`interval_s`, after one whole window (at t = 0 it would see an idle fleet and no load, and
the reactive baselines would drain the warm fleet before the first request). A planner with
a `start_fleet(window, fleet)` method (the `StartsFleet` protocol) may raise its own start
from that fleet: pdorch with `planner.cold_start_spare` holds the spare of its floor at the
first window's load (without it the fleet is unchanged). The static
planners are the exception: their fixed fleet is in place from the start (that is what static
provisioning means). The oracle's replicas start instantly (`startup_s` 0, its definition);
it and the static planners are handed the trace as `requests=[(arrival_s, isl, osl, hit)]`
(`trace_requests`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from autoscale.baselines.oracle import OraclePlanner
from autoscale.load_window import LoadWindow
from autoscale.perf_model import build_perf_model
from autoscale.planner_base import Planner
from autoscale.planners import planner_factory
from autoscale.policy import SloPolicy
from autoscale.signals import Observation, Pool, PoolStatus
from autoscale.sizing import clamp_to_limits, itl_target_s, ttft_target_s
from benchmarks.autoscale_sim.actuator import SimActuator
from benchmarks.autoscale_sim.observe import ObservationBuilder
from benchmarks.autoscale_sim.result import BreachTracker, Recorder, planner_result
from benchmarks.fleet_sim.block_ids import BlockChain
from benchmarks.fleet_sim.fleet import FleetSpec
from benchmarks.fleet_sim.membership import DynamicFleetSimulator
from benchmarks.fleet_sim.simulator import SimConfig
from benchmarks.workloads.model import Segment, Workload, output_content_id

CLAIRVOYANT = ("oracle", "oracle-cold", "static-peak", "static-mean")  # planners handed the trace
# `NAME+VARIANT` runs planner NAME with role switching forced on (and options), so one run
# can hold a planner with and without it side by side: `pdorch,pdorch+role-switching`
VARIANTS: dict[str, tuple[bool | None, dict[str, Any]]] = {
    "role-switching": (True, {}),
    "role-switching-bridge": (True, {"stand_in": False}),  # pdorch: bridge a shortage only
    # a move held to both pools' reversal rules (`autoscale.role_moves`, Round 11)
    "role-switching-stable": (True, {"move_stabilization": True}),
    # the budget keeps the provisioned fleet the tick it starts binding (`autoscale.cross_pool`)
    "budget-keep-fleet": (None, {"budget_keep_fleet": True}),
    "budget-fresh": (None, {"budget_keep_fleet": False}),  # the split before Round 12
    "role-switching-budget-keep-fleet": (True, {"budget_keep_fleet": True}),
    # a move's giver gives only what its own way down would release (`autoscale.role_moves`)
    "role-switching-release": (True, {"move_release_check": True}),
    # the actuator's scale-up order (`SimActuator`: recall, move a draining replica, cold
    # start), each step turned off to measure what it gains (ACTUATOR_OPTIONS)
    "role-switching-no-drain-moves": (True, {}),
    "role-switching-no-recall": (True, {}),
    "no-recall": (None, {}),
    # the decode cold-start spare as given, learnt from the load, or none (`autoscale.spare`)
    "spare-fixed": (None, {"cold_start_spare_mode": "fixed"}),
    "spare-learnt": (None, {"cold_start_spare_mode": "learnt"}),
    "spare-none": (None, {"cold_start_spare": None}),
    # prefill's own scale-down window (Round 15) alone and with a prefill reversal budget of 2 in
    # any 600 s (`autoscale.reversal_budget`, Round 16)
    "prefill-down-90": (None, {"prefill_scale_down_s": 90.0}),
    "prefill-down-90-budget": (
        None,
        {"prefill_scale_down_s": 90.0, "reversal_budget": {"prefill": {"count": 2}}},
    ),
}
ACTUATOR_OPTIONS: dict[str, dict[str, bool]] = {
    "role-switching-no-drain-moves": {"drain_moves": False},
    "role-switching-no-recall": {"recall": False, "drain_moves": False},
    "no-recall": {"recall": False, "drain_moves": False},
}
INSTANT = ("oracle",)  # planners whose replicas start instantly
STATIC = ("static-peak", "static-mean")


@dataclass(slots=True)
class AutoscaleSimConfig:
    """Simulator settings of a what-if run (the model, GPU and TP come from the policy)."""

    router_policy: str = "token_load"
    block_size: int = 64
    tick_s: float = 0.5
    record_s: float = 10.0
    fast_forward: bool = True
    seed: int = 0
    role_switching: bool | None = None  # None: the policy's
    initial: dict[Pool, int] | None = None  # None: the oracle's first interval
    planner_options: dict[str, dict[str, Any]] = field(default_factory=dict)


def trace_requests(workload: Workload, block_size: int) -> list[tuple[float, int, int, float]]:
    """The workload as `(arrival_s, isl, osl, hit)` for the clairvoyant planners.

    Arrival: a session's `start_s` for turn 0, then each later turn `think_time_s` after the
    previous turn's arrival (a lower bound: the real gap adds the previous turn's service).
    Closed-loop sessions (no `start_s`) start at 0. Hit: the prefix an infinite cache over all
    earlier requests would hold (the simulator's `oracle_hit_tokens`), in arrival order.
    """
    items: list[tuple[float, int, int, Any]] = []
    for si, s in enumerate(workload.sessions):
        t = s.start_s or 0.0
        for k, turn in enumerate(s.turns):
            if k > 0:
                t += turn.think_time_s
            items.append((t, si, k, turn))
    items.sort(key=lambda x: (x[0], x[1], x[2]))
    seen: set[int] = set()
    chains: dict[int, BlockChain] = {}
    out = []
    for t, si, k, turn in items:
        s = workload.sessions[si]
        chain = chains.get(si) if s.carry_context else None
        if chain is None:
            chain = BlockChain(block_size)
            chains[si] = chain
        chain.extend(turn.new_segments)
        isl = chain.num_tokens
        keys = list(chain.ids)
        max_hit = (isl - 1) // block_size
        hit = 0
        while hit < max_hit and keys[hit] in seen:
            hit += 1
        chain.extend([Segment(output_content_id(s.session_id, k), turn.output_tokens)])
        seen.update(chain.ids)
        out.append((t, isl, turn.output_tokens, hit * block_size / isl if isl else 0.0))
    return out


def planner_variant(name: str) -> tuple[str, bool | None, dict[str, Any]]:
    """`NAME[+VARIANT]` -> (NAME, role switching override or None, planner options)."""
    base, sep, variant = name.partition("+")
    if not sep:
        return name, None, {}
    if variant not in VARIANTS:
        raise ValueError(
            f"unknown planner variant {variant!r} in {name!r}; known: {', '.join(VARIANTS)}"
        )
    switching, options = VARIANTS[variant]
    if options and base != "pdorch":
        raise ValueError(f"variant {variant!r} is pdorch's only")
    return base, switching, dict(options)


def make_planner(
    name: str,
    policy: SloPolicy,
    requests: list[tuple[float, int, int, float]],
    options: dict[str, Any] | None = None,
) -> tuple[Planner, Any]:
    """The planner `name` with its own perf model (returned too: the loop feeds its fit)."""
    perf = build_perf_model(policy)
    opts = dict(options or {})
    if name in CLAIRVOYANT:
        opts.setdefault("requests", requests)
    return planner_factory(name)(policy, perf, **opts), perf


@runtime_checkable
class StartsFleet(Protocol):
    """A planner that may raise the shared start fleet (module docstring): pdorch's
    `start_fleet` holds its `cold_start_spare` at the first window's load. Structural, so a
    planner opts in by having the method, as before, but the call is typed."""

    def start_fleet(self, window: LoadWindow, fleet: dict[Pool, int]) -> dict[Pool, int]: ...


def initial_fleet(
    name: str, planner: Planner, policy: SloPolicy, requests: list[tuple[float, int, int, float]]
) -> dict[Pool, int]:
    """The fleet at t = 0 (module docstring)."""
    if name in STATIC:
        empty = {p: PoolStatus() for p in Pool}
        d = planner.plan(Observation(now=0.0, window_s=0.0, pools=empty))
        return {p: max(1, d.desired.get(p, 1)) for p in Pool}
    oracle, _ = make_planner("oracle", policy, requests)
    assert isinstance(oracle, OraclePlanner)
    # the window-mean sizing (not the oracle's prefill replay): every planner's start fleet
    # stays what it was before the replay rule (autoscale/baselines/oracle.py)
    need = oracle.mean_need(0.0, oracle.interval_s)
    fleet = {p: max(1, clamp_to_limits(policy, p, need[p])[0]) for p in Pool}
    # a planner that holds a standing spare (pdorch's `cold_start_spare`) starts with it: the
    # fleet its own floor holds at the first window's load, never below the shared one
    if isinstance(planner, StartsFleet):
        fleet = dict(planner.start_fleet(oracle.future(0.0, oracle.interval_s), fleet))
    return fleet


def run_planner(
    workload: Workload,
    policy: SloPolicy,
    name: str,
    config: AutoscaleSimConfig | None = None,
    *,
    progress: Callable[[float], None] | None = None,
    requests: list[tuple[float, int, int, float]] | None = None,
) -> dict[str, Any]:
    """Simulate `workload` under planner `name`; the result dict of `result.planner_result`."""
    cfg = config or AutoscaleSimConfig()
    label = name
    name, variant_switching, variant_options = planner_variant(label)
    switching = variant_switching if variant_switching is not None else cfg.role_switching
    if switching is not None and switching != policy.role_switching:
        # the override reaches the planner (it proposes moves) as well as the actuator
        policy = policy.model_copy(update={"role_switching": switching})
    if requests is None:
        requests = trace_requests(workload, cfg.block_size)
    options = {**variant_options, **cfg.planner_options.get(label, {})}
    planner, perf = make_planner(name, policy, requests, options)
    init = cfg.initial or initial_fleet(name, planner, policy, requests)
    sim_cfg = SimConfig(
        fleet=FleetSpec(prefill=init[Pool.PREFILL], decode=init[Pool.DECODE]),
        policy=cfg.router_policy,
        model=policy.model_profile,
        gpu=policy.gpu,
        tp=policy.tp,
        block_size=cfg.block_size,
        tick_s=cfg.tick_s,
        fast_forward=cfg.fast_forward,
        seed=cfg.seed,
    )
    role_switching = policy.role_switching
    state: dict[str, Any] = {}

    def controller(sim: DynamicFleetSimulator, now: float) -> None:
        if not state:
            state["builder"] = ObservationBuilder(sim, ttft_target_s(policy), itl_target_s(policy))
            state["record"] = ObservationBuilder(sim, ttft_target_s(policy), itl_target_s(policy))
            state["actuator"] = SimActuator(
                sim,
                policy,
                instant=name in INSTANT,
                role_switching=role_switching,
                **ACTUATOR_OPTIONS.get(label.partition("+")[2], {}),
            )
            state["recorder"] = Recorder(policy)
            state["breaches"] = BreachTracker(policy)
            # the first tick sees a whole window: the fleet at t = 0 is the initial one
            state["next_plan"] = planner.interval_s
            state["next_record"] = cfg.record_s
            state["plan_cpu_s"] = 0.0
        if now >= state["next_plan"] - 1e-9:
            state["next_plan"] = now + planner.interval_s
            obs = state["builder"].observe(now)
            c0 = time.process_time()
            observe = getattr(perf, "observe", None)
            if observe is not None:
                observe(obs)
            decision = planner.plan(obs)
            state["plan_cpu_s"] += time.process_time() - c0
            state["breaches"].see(obs, decision)
            state["actuator"].apply(decision, now)
        if now >= state["next_record"] - 1e-9:
            state["next_record"] = now + cfg.record_s
            state["recorder"].sample(state["record"].observe(now), sim)

    sim = DynamicFleetSimulator(
        workload, sim_cfg, controller=controller, control_interval_s=cfg.tick_s, progress=progress
    )
    dyn = sim.run_dynamic()
    result = planner_result(
        label,
        policy,
        dyn,
        sim,
        state["actuator"],
        state["recorder"],
        state["breaches"],
        initial=init,
        role_switching=role_switching,
        plan_cpu_s=state["plan_cpu_s"],
    )
    result["interval_s"] = planner.interval_s
    return result
