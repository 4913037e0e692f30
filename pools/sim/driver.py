"""The one engine driver loop: step, apply outputs, drain events, next wake-up; any clock.

Every caller of an `EngineCore` runs the same cycle, so it lives here once:

    driver = EngineDriver(core)
    ...                                   # add_request / finish_remote_load / ... at `now`
    adv = driver.tick(now, on_outputs)    # at adv.wake (or sooner when new input arrives)

`tick(now)`:

1. the step in flight, if it has ended by `now`, completes: its KV events are drained and
   `on_outputs(result, events)` is called (outputs and events are valid at `result.end`; vLLM
   publishes a step's KV events with its outputs, in `update_from_output`);
2. `core.next_step_time(now)`: None -> idle (`wake` None: call again when new input arrives);
   later than `now` -> a timer (a lease expiry: `wake` is that time, nothing runs);
3. due now: with a `horizon`, the scheduler's decode fast-forward is tried first (many
   pure-decode steps in one call, all ending by `horizon()`; their events are drained at once
   and returned); otherwise one step starts and stays in flight until `result.end` (= `wake`).

A step started by a tick completes at a later tick, never the same one, so a caller on a
discrete-event clock sees the outputs exactly at the step's end (a zero-length step included).

Clock-agnostic: `now` is whatever the caller's clock says (real seconds scaled in the sim
server's runner, virtual seconds in the fleet simulator and the fidelity replay). The driver
never sleeps and never reads a clock; it tells the caller when to come back (`Advance.wake`).
Callers: `pools/sim/runner.py` (asyncio, real time), `benchmarks/fleet_sim/simulator.py` (one
event heap over many replicas), `benchmarks/fidelity_fit.py` (closed-loop replay).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pools.sim.engine_core import EngineCore
from pools.sim.kv_events import KVCacheEvent
from pools.sim.outputs import DecodeFastForward, StepResult

OnOutputs = Callable[[StepResult, list[KVCacheEvent]], None]
"""Called with a completed step and the KV events drained with it (valid at `result.end`)."""


@dataclass(slots=True)
class Advance:
    """What a tick left running and when to tick next.

    `wake`: the time of the next tick (the step's end, a fast-forward's end or a lease expiry),
    None when idle until new input. `step`: the step started by this tick (in flight until
    `step.end`). `fast_forward`: the pure-decode stretch this tick ran (its outputs are valid at
    its `step_ends`, the last being `wake`), with `events` its KV events.
    """

    wake: float | None
    step: StepResult | None = None
    fast_forward: DecodeFastForward | None = None
    events: list[KVCacheEvent] = field(default_factory=list)

    @property
    def busy(self) -> bool:
        """The engine computes until `wake` (a step or stretch with a duration)."""
        if self.step is not None:
            return self.step.duration_s > 0
        return self.fast_forward is not None


class EngineDriver:
    """Drives one `EngineCore` through its step cycle; see the module docstring."""

    __slots__ = ("core", "in_flight")

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.in_flight: StepResult | None = None

    def wake_time(self, now: float) -> float | None:
        """When `tick` should run next: the end of the step in flight, else the core's next
        step time (None: idle). Call after new input to learn whether to tick sooner."""
        if self.in_flight is not None:
            return self.in_flight.end
        return self.core.next_step_time(now)

    def tick(
        self,
        now: float,
        on_outputs: OnOutputs | None = None,
        horizon: Callable[[], float] | None = None,
    ) -> Advance:
        """Complete the step that ended by `now`, then start what is due at `now`.

        `horizon` (optional, evaluated only when a step is due, after `on_outputs` ran): the
        earliest time anything outside can touch this engine; a decode fast-forward runs up to
        it. Without it every step is stepped one by one.
        """
        core = self.core
        res = self.in_flight
        if res is not None:
            if res.end > now:
                return Advance(res.end)  # still computing
            self.in_flight = None
            events = core.drain_events()
            if on_outputs is not None:
                on_outputs(res, events)
        t = core.next_step_time(now)
        if t is None:
            return Advance(None)
        if t > now:
            return Advance(t)
        if horizon is not None:
            ff = core.fast_forward_decode(now, horizon())
            if ff is not None:
                return Advance(ff.end, fast_forward=ff, events=core.drain_events())
        res = core.step(t)
        self.in_flight = res
        return Advance(res.end, step=res)
