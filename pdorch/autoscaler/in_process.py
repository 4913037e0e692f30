"""`pdorch serve`'s in-process autoscaler: one control loop per model that has an SLO policy.

A fleet file with `models:` runs one coordinator per model (`pdorch/app/server.py`), each with
its own `ScalingControl` over its own `LocalActuator`, bounded by its own SLO policy (the
model's `slo_policy`, else `--slo-policy`). Each such model gets its own `ControlLoop`: the
pdorch planner over that policy, a `coordinator` source reading that model's `/metrics` and
`/admin/pools` (`?model=NAME`) with its actuator's pool counts, and an `InProcessDriver` over
its `ScalingControl`, so every model is scaled against its own TTFT/ITL SLO and one model's
load never moves another's pools. Each loop ticks at its policy's `intervals.reactive_s`.

A one-model fleet keeps its old rule: a loop only with `--slo-policy` (`policy`), reading the
coordinator without `?model=`. A model that launches no engines (no `ScalingControl`) gets no
loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from autoscale.policy import SloPolicy
from pdorch.app.scaling import ScalingControl
from pdorch.autoscaler.loop import ControlLoop, InProcessDriver
from pdorch.autoscaler.source import ActuatorCounts, loop_source


def model_control_loops(running: Any, policy: SloPolicy | None) -> dict[str, ControlLoop]:
    """The loops to run, by served model name (`running`: `pdorch.app.server.RunningCoordinator`;
    `policy`: `--slo-policy`, or None)."""
    import autoscale.planners  # noqa: F401  (registers every planner)
    from autoscale.perf_model import build_perf_model
    from autoscale.planner_base import planner_factory

    several = len(running.models) > 1
    loops: dict[str, ControlLoop] = {}
    for name, (coordinator, _) in running.models.items():
        scaling = coordinator.scaling
        if not isinstance(scaling, ScalingControl):
            continue
        # several models: the actuator's policy is the model's own (else --slo-policy)
        chosen = scaling.actuator.policy if several else policy
        if chosen is None:
            continue
        planner = planner_factory("pdorch")(chosen, build_perf_model(chosen))
        source = loop_source(
            "coordinator",
            ActuatorCounts(scaling),
            url=running.url,
            admin_token=coordinator.admin_token,
            model=name if several else None,
        )
        loops[name] = ControlLoop(
            planner, source, InProcessDriver(scaling), chosen.intervals.reactive_s
        )
    return loops


async def run_loops(loops: dict[str, ControlLoop], stop: asyncio.Event) -> None:
    """Run every loop until `stop` is set, then close their sources."""
    try:
        await asyncio.gather(*(loop.run(stop) for loop in loops.values()))
    finally:
        for loop in loops.values():
            await loop.source.aclose()
