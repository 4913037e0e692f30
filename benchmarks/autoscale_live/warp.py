"""Time compression of the live run: the planner lives in virtual (trace) time, the fleet in real.

The live fleet runs `t` real seconds per virtual second (`time_scale` t, the simulated engines'
`--time-scale`; arrivals are the trace's times x t). So that the planner and its policy are
exactly those of the virtual-time what-if, everything the planner reads is stretched back to
virtual time, and everything the harness does in real time is shrunk to it:

    planner side (virtual)                  live side (real)
    Observation.now, window_s      = real x 1/t   (the control loop's clock is `VirtualClock`)
    arrival_rps                    = real x t     (follows from the virtual window)
    TTFT / ITL percentiles, means  = real x 1/t   (`stretch_observation`)
    ReplicaSignals.mean_step_s     = real x 1/t
    token counts, KV usage, queue lengths, replica counts: unchanged (no time in them)
    control-loop period            reactive_s x t real seconds
    drain bound                    drain_timeout_s x t real seconds (`real_time_policy`)
    cold start                     a new replica is held pending until startup_s x t real
                                   seconds after its start began (`ColdStartFloor`)

A faithful replica of a GPU engine at t x speed shows TTFTs and ITLs t x shorter, so the
stretched values are what the same engine would show in virtual time; where the machine is too
slow to keep up with the compressed engines, the stretched latencies come out longer than the
what-if's (the report's ratios show it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from autoscale.metrics_sources.base import MetricsSource
from autoscale.policy import SloPolicy
from autoscale.signals import LatencySummary, Observation


def _stretch(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def stretch_latency(summary: LatencySummary, factor: float) -> LatencySummary:
    """`summary` with every time multiplied by `factor` (its count unchanged)."""
    return LatencySummary(
        count=summary.count,
        p50_s=_stretch(summary.p50_s, factor),
        p90_s=_stretch(summary.p90_s, factor),
        p99_s=_stretch(summary.p99_s, factor),
        mean_s=_stretch(summary.mean_s, factor),
    )


def stretch_observation(obs: Observation, time_scale: float) -> Observation:
    """Real-time latencies of `obs` as virtual ones (x 1/t; see the module docstring).

    `now`, `window_s` and `arrival_rps` are left as they are: the control loop already gives
    the source a virtual `now`, so the window and the rate come out virtual.
    """
    factor = 1.0 / time_scale
    return dataclasses.replace(
        obs,
        ttft=stretch_latency(obs.ttft, factor),
        itl=stretch_latency(obs.itl, factor),
        replicas=tuple(
            dataclasses.replace(r, mean_step_s=_stretch(r.mean_step_s, factor))
            for r in obs.replicas
        ),
    )


class VirtualClock:
    """Virtual seconds since `origin` on `clock`: (clock() - origin) / time_scale."""

    def __init__(
        self,
        time_scale: float,
        origin: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.time_scale = time_scale
        self.clock = clock
        self.origin = clock() if origin is None else origin

    def __call__(self) -> float:
        return (self.clock() - self.origin) / self.time_scale

    def real(self, virtual_s: float) -> float:
        """The `clock` reading at virtual time `virtual_s`."""
        return self.origin + virtual_s * self.time_scale


class StretchedSource(MetricsSource):
    """`inner`'s observations in virtual time (`stretch_observation`)."""

    def __init__(self, inner: MetricsSource, time_scale: float) -> None:
        self.inner = inner
        self.time_scale = time_scale
        self.name = f"{inner.name} (x{1 / time_scale:g} stretched)"

    async def observe(self, now: float) -> Observation:
        return stretch_observation(await self.inner.observe(now), self.time_scale)

    async def aclose(self) -> None:
        await self.inner.aclose()


def real_time_policy(policy: SloPolicy, time_scale: float) -> SloPolicy:
    """The policy the live actuator enforces: each pool's `drain_timeout_s` and `startup_s`
    x t (real seconds); limits, budget and everything the planner reads unchanged."""
    pools = {
        pool: limits.model_copy(
            update={
                "drain_timeout_s": limits.drain_timeout_s * time_scale,
                "startup_s": limits.startup_s * time_scale,
            }
        )
        for pool, limits in policy.pools.items()
    }
    return policy.model_copy(update={"pools": pools})


class ColdStartFloor:
    """A join check that holds a new replica pending until `startup_s x t` after its start.

    The simulated engine's process is ready in a second or two; a GPU engine's cold start is
    the policy's `startup_s`. Wrapping the actuator's `join_check` (the coordinator's "its KV
    events are live"), a replica may join routing only when `inner` says yes and the floor
    has passed since `started(replica_id)` was called: the harness calls it when the actuator
    begins bringing the replica up (its `RunningFleet.new_engine`, the moment the actuator's
    own decision → ready time counts from, right after the decision). A replica never
    reported as started counts from its first check.
    """

    def __init__(
        self,
        inner: Callable[[str], bool],
        floor_s: Callable[[str], float],
        pool_of: Callable[[str], str | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.floor_s = floor_s
        self.pool_of = pool_of
        self.clock = clock
        self._started_at: dict[str, float] = {}

    def started(self, replica_id: str) -> None:
        """The actuator began bringing `replica_id` up now."""
        self._started_at.setdefault(replica_id, self.clock())

    def __call__(self, replica_id: str) -> bool:
        at = self._started_at.setdefault(replica_id, self.clock())
        pool = self.pool_of(replica_id) or ""
        return self.clock() >= at + self.floor_s(pool) and self.inner(replica_id)
