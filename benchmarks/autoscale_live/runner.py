"""One live autoscaling run: a real coordinator, engines as processes, the in-process loop.

    result = await run_live(workload, policy, LiveAutoscaleConfig(time_scale=0.2))

What runs (the pieces `pdorch serve --slo-policy` runs, nothing stood in for):

- `pdorch.app.server.run_coordinator` over `fleet.live_fleet_config`: the coordinator and its
  HTTP server in this process, every replica a `pdorch engine sim` process started and stopped
  by the coordinator's `LocalActuator` (`autoscale/actuators/local.py`), bounded by the
  policy's limits with real-time drain timeouts (`warp.real_time_policy`);
- the control loop of `pdorch serve --slo-policy` (`pdorch.autoscaler.loop.ControlLoop`:
  `CoordinatorSource` over the coordinator's HTTP API with the actuator's counts → the
  planner → `InProcessDriver`), on a virtual clock and with stretched observations
  (`warp.py`), its `tick` at virtual k x `reactive_s` (a fixed schedule, as the what-if's);
  new replicas held pending for their emulated cold start (`warp.ColdStartFloor`);
- the live load client (`benchmarks.live.runner.run_workload`): the compressed workload,
  open loop, `/v1/completions` streams whose prompts are token ids (the trace's exact prompt
  lengths; `benchmarks.workloads.text.completion_token_ids`).

Before the load starts the loop primes its source (the first read of a windowed source);
its first planned tick is one interval later, as in the what-if. After the last request, the
run waits for drains and starts still in progress (bounded) so their times are counted.

The result (times in virtual seconds unless a name ends in `_real_s`): per request the
client's measurements, `failed` (non-200, an error event in the stream, a stream without
`[DONE]`, a transport error, or fewer tokens than asked: `benchmarks/live/client.py`);
`timeline` (pool counts every `sample_s`), `events` (every change of a pool's provisioned
count with the planner's reason), `drains` (each scale-down's replica, the requests it had in
flight when its drain began, its duration, timed out, requests cut), decision → ready and
decision → drained times per pool, attainment with the what-if's definition
(`report.live_accounting`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import autoscale.planners  # noqa: F401  (registers every planner)
from autoscale.decision import ScaleDecision
from autoscale.perf_model import build_perf_model
from autoscale.planner_base import planner_factory
from autoscale.policy import SloPolicy
from autoscale.signals import Observation, Pool, PoolStatus
from benchmarks.autoscale_live.fleet import (
    SERVED_MODEL,
    compress_workload,
    live_fleet_config,
    longest_request_tokens,
)
from benchmarks.autoscale_live.warp import (
    ColdStartFloor,
    StretchedSource,
    VirtualClock,
    real_time_policy,
)
from benchmarks.live.client import RequestResult
from benchmarks.live.runner import LiveConfig, run_workload
from benchmarks.workloads.model import Workload
from pdorch.app.scaling import ScalingControl
from pdorch.app.server import run_coordinator
from pdorch.autoscaler.loop import ControlLoop, InProcessDriver
from pdorch.autoscaler.source import ActuatorCounts, loop_source
from pools.replica import ReplicaState

POOLS = (Pool.PREFILL, Pool.DECODE)
log = logging.getLogger(__name__)


@dataclass(slots=True)
class LiveAutoscaleConfig:
    """Settings of a live run (the policy gives model, GPU, TP, limits and intervals)."""

    time_scale: float = 0.2  # real seconds per virtual second (engines' --time-scale)
    planner: str = "pdorch"
    router_policy: str = "token_load"
    block_size: int = 64
    initial: dict[Pool, int] = field(default_factory=lambda: {Pool.PREFILL: 1, Pool.DECODE: 1})
    sample_s: float = 1.0  # virtual seconds between timeline samples
    request_timeout_s: float = 600.0  # real
    settle_timeout_s: float = 120.0  # real: wait for drains/starts after the load
    log_dir: Path | None = None


class RecordingDriver:
    """`InProcessDriver` that also records what each decision changed (module docstring)."""

    def __init__(self, scaling: ScalingControl):
        self.inner = InProcessDriver(scaling)
        self.scaling = scaling
        self.events: list[dict[str, Any]] = []
        self.desired: dict[str, list[int]] = {p.value: [] for p in POOLS}
        self.drains: list[dict[str, Any]] = []
        self.ticks = 0

    async def apply(self, decision: ScaleDecision, obs: Observation) -> None:
        actuator = self.scaling.actuator
        before = actuator.current()
        draining_before = {r.replica_id for r in _draining(actuator)}
        await self.inner.apply(decision, obs)
        after = actuator.current()
        self.ticks += 1
        for pool in POOLS:
            b, a = before.get(pool, PoolStatus()), after.get(pool, PoolStatus())
            if pool in decision.desired:
                self.desired[pool.value].append(decision.desired[pool])
            if a.provisioned != b.provisioned:
                self.events.append(
                    {
                        "t_s": obs.now,
                        "pool": pool.value,
                        "from": b.provisioned,
                        "to": a.provisioned,
                        "reason": decision.reasons.get(pool, "planner"),
                        "kind": "scale",
                    }
                )
        for replica in _draining(actuator):
            if replica.replica_id not in draining_before:
                self.drains.append(
                    {
                        "replica": replica.replica_id,
                        "pool": replica.pool,
                        "t_s": obs.now,
                        "in_flight_at_start": actuator.tracker.in_flight(replica.replica_id),
                    }
                )


def _draining(actuator: Any) -> list[Any]:
    return [
        r
        for pool in actuator.pools()
        for r in actuator.fleet.replicas(pool)
        if r.state == ReplicaState.DRAINING
    ]


async def run_live(
    workload: Workload,
    policy: SloPolicy,
    cfg: LiveAutoscaleConfig,
    *,
    on_result: Callable[[RequestResult], None] | None = None,
) -> dict[str, Any]:
    """Run `workload` (virtual time) live, compressed by `cfg.time_scale` (module docstring)."""
    ts = cfg.time_scale
    live_workload = compress_workload(workload, ts)
    longest = longest_request_tokens(workload)
    config = live_fleet_config(
        policy,
        cfg.initial,
        time_scale=ts,
        block_size=cfg.block_size,
        router_policy=cfg.router_policy,
        max_model_len=max(2048, longest + 2 * cfg.block_size),
    )
    wall0 = time.perf_counter()
    async with run_coordinator(
        config, slo_policy=real_time_policy(policy, ts), log_dir=cfg.log_dir
    ) as pd:
        scaling = pd.coordinator.scaling
        assert isinstance(scaling, ScalingControl), "the live fleet launches its engines"
        actuator = scaling.actuator
        fleet_ready_real_s = time.perf_counter() - wall0

        def pool_of(replica_id: str) -> str | None:
            replica = actuator.fleet.get(replica_id)
            return None if replica is None else replica.pool

        floor = ColdStartFloor(
            actuator.join_check,
            lambda pool: (
                policy.limits(Pool(pool)).startup_s * ts if pool in ("prefill", "decode") else 0.0
            ),
            pool_of,
        )
        actuator.join_check = floor
        actuator.on_start = floor.started  # the actuator's bring-up begins here
        planner = planner_factory(cfg.planner)(policy, build_perf_model(policy))
        source = StretchedSource(
            loop_source(
                "coordinator",
                ActuatorCounts(scaling),
                url=pd.url,
                admin_token=pd.coordinator.admin_token,
            ),
            ts,
        )
        clock = VirtualClock(ts)
        driver = RecordingDriver(scaling)
        loop = ControlLoop(planner, source, driver, interval_s=planner.interval_s * ts, clock=clock)
        timeline: list[dict[str, Any]] = []
        stop = asyncio.Event()

        async def sample() -> None:
            while not stop.is_set():
                row: dict[str, Any] = {"t_s": clock()}
                for pool, status in actuator.current().items():
                    row[str(pool)] = {
                        "ready": status.ready,
                        "pending": status.pending,
                        "draining": status.draining,
                    }
                timeline.append(row)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), cfg.sample_s * ts)

        async def control() -> None:
            # `ControlLoop.tick` on a fixed schedule, tick k at virtual k x interval_s, as the
            # what-if ticks (`ControlLoop.run` waits a whole period after each tick, so its
            # ticks drift by a tick's own duration, which compression makes 1/t x larger)
            await loop.tick()  # primes the source's window at t = 0
            k = 1
            while not stop.is_set():
                delay = clock.real(k * planner.interval_s) - time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, delay))
                if stop.is_set():
                    break
                try:
                    await loop.tick()
                except Exception:  # one bad tick must not end the run (as ControlLoop.run)
                    log.exception("autoscaler tick failed")
                k = max(k + 1, math.floor(clock() / planner.interval_s) + 1)

        live_cfg = LiveConfig(
            base_url=pd.url,
            model=SERVED_MODEL,
            api="completions",
            request_timeout_s=cfg.request_timeout_s,
            prompt_token_ids=True,
        )
        tasks = [asyncio.ensure_future(sample()), asyncio.ensure_future(control())]
        try:
            run = await run_workload(live_workload, live_cfg, on_result=on_result)
            load_end = clock()
            stop.set()
            await asyncio.gather(*tasks)
            # the scale-downs and starts already decided finish (their times are counted)
            settled = True
            try:
                await actuator.idle(cfg.settle_timeout_s)
            except TimeoutError:
                settled = False
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await loop.source.aclose()
        stats = actuator.stats
        outcomes = {o.replica_id: (pool, o) for pool, o in stats.drains}
        for drain in driver.drains:
            _, outcome = outcomes.get(drain["replica"], (None, None))
            if outcome is not None:
                drain.update(
                    duration_s=outcome.duration_s / ts,
                    duration_real_s=outcome.duration_s,
                    timed_out=outcome.timed_out,
                    cut=outcome.cut,
                )
        return {
            "results": run.results,
            "planned": run.planned_requests,
            "load_wall_real_s": run.wall_s,
            "load_end_s": load_end,
            "end_s": clock(),
            "fleet_start_real_s": fleet_ready_real_s,
            "settled": settled,
            "timeline": timeline,
            "events": driver.events,
            "desired": driver.desired,
            "drains": driver.drains,
            "ticks": driver.ticks,
            "ready_real_s": [(pool, s) for pool, s in stats.ready_s],
            "drain_real_s": [(pool, o.duration_s) for pool, o in stats.drains],
            "failed_starts": dict(stats.failed_starts),
            "started": dict(stats.started),
            "stopped": dict(stats.stopped),
            "decision_reasons": {f"{p}/{r}": n for (p, r), n in scaling.decision_reasons.items()},
            "interval_s": planner.interval_s,
            "time_scale": ts,
            "initial": {p.value: n for p, n in cfg.initial.items()},
        }
