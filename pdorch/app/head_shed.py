"""Shedding at the request head: when the coordinator's own event loop lags, or too many
requests wait to reach admission, new unprotected requests get 429 before their body is read.

Why: bounded admission (`admission.py`) orders and sheds requests only once the loop runs their
handler. On a starved coordinator (a shared box, a connect storm) the loop itself is the queue:
request heads, body reads and handler starts wait in FIFO order, unprioritised and with no
deadline, so a burst of low-priority requests delays the high-priority ones in front of
admission (`overload-mixed`, `benchmarks/results/reliability.md`: steady p99 TTFT 9.7 s →
77.9 s). The edge (`edge.py`) asks `HeadShed.decide` when a head is complete, before a handler
task exists; a shed request costs one small write.

The lag (`LagGate`, pure: the caller passes `now`, the loop's clock): `LagProbe` wakes every
`probe_interval_s` and reports how late it woke (`lag = woke - due`). The loop lags at `now` when
- the probe is overdue: `now - due > max_lag_s` (a probe that cannot run is the loudest
  sample, and this one is known before it runs: the edge sees it from inside the stall), or
- a sample over `max_lag_s` was taken within the last `hold_s` (what was accepted during the
  stall is still queued on the loop after it ends; without the hold the gate would flap open
  on every probe that happens to run on time between two slow turns).

`HeadShed.decide(priority, now)` → `None` (let it through) or a reason, in this order:
1. `priority >= protected_priority` → never shed here (admission still applies);
2. the loop lags (above) → `"loop_lag"`;
3. `max_pending_requests` heads already wait to reach the handler → `"pending"`.

Parameters (fleet file `coordinator.head_shed`, `pdorch/config/head_shed.py`): `max_lag_s`
(None: no lag shedding), `hold_s` [1 s], `probe_interval_s` [0.05 s: 20 wakes a second, ~1 µs
of loop time each], `protected_priority` [1: any positive `x-pdorch-priority`],
`max_pending_requests` [1024]. Only client POSTs of the OpenAI routes are shed (`SHED_PATHS`);
`/health`, `/metrics` and `/admin/*` never are.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pdorch.config.head_shed import HeadShedSettings
from pools.periodic import PeriodicLoop

ShedReason = Literal["loop_lag", "pending"]
SHED_PATHS = frozenset(
    {b"/v1/completions", b"/v1/chat/completions", b"/v1/responses", b"/v1/embeddings"}
)


@dataclass(slots=True)
class LagGate:
    """The loop-lag rule of the module docstring (pure: every method takes `now`)."""

    max_lag_s: float | None
    hold_s: float = 1.0
    due: float | None = None  # when the probe should wake next (None: not started)
    last_lag_s: float = 0.0  # the last sample
    over_at: float | None = None  # when the last sample over `max_lag_s` was taken

    def expect(self, due: float) -> None:
        """The probe sleeps until `due`."""
        self.due = due

    def observe(self, lag_s: float, now: float) -> None:
        """The probe woke at `now`, `lag_s` late."""
        self.last_lag_s = lag_s
        self.due = None
        if self.max_lag_s is not None and lag_s > self.max_lag_s:
            self.over_at = now

    def lag_s(self, now: float) -> float:
        """The lag as known at `now`: the probe's overdue time while it is late, else the last
        sample."""
        overdue = 0.0 if self.due is None else now - self.due
        return max(overdue, self.last_lag_s)

    def lagging(self, now: float) -> bool:
        if self.max_lag_s is None:
            return False
        if self.due is not None and now - self.due > self.max_lag_s:
            return True
        return self.over_at is not None and now - self.over_at < self.hold_s


@dataclass(slots=True)
class HeadShed:
    """The head-shedding decision (module docstring) and the count of heads waiting to reach
    their handler (`pending`: +1 at a head let through, -1 when its handler starts or its
    connection is lost first: both counted by the edge, `edge.py`)."""

    gate: LagGate
    protected_priority: int = 1
    max_pending_requests: int | None = 1024
    pending: int = 0
    on_shed: Callable[[str], None] | None = None  # told each reason it sheds (the metrics)

    @classmethod
    def from_settings(cls, settings: HeadShedSettings) -> HeadShed:
        return cls(
            LagGate(settings.max_lag_s, settings.hold_s),
            protected_priority=settings.protected_priority,
            max_pending_requests=settings.max_pending_requests,
        )

    def handler_started(self) -> None:
        """A head let through reached its handler (the edge calls it as the task runs)."""
        self.pending -= 1

    def decide(self, priority: int, now: float) -> ShedReason | None:
        if priority >= self.protected_priority:
            return None
        if self.gate.lagging(now):
            return "loop_lag"
        if self.max_pending_requests is not None and self.pending >= self.max_pending_requests:
            return "pending"
        return None


class LagProbe(PeriodicLoop):
    """The loop's lag sampler: a round every `interval_s` (`pools.periodic.PeriodicLoop`: its
    schedule from each round's start, so a round is due `interval_s` after the last one
    began) tells `gate` how late it ran and when the next is due; `on_sample(lag_s)` too
    (the metrics gauge). One round is a few attribute writes: ~1 µs of loop time."""

    def __init__(
        self,
        gate: LagGate,
        interval_s: float,
        on_sample: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__()
        self.gate = gate
        self.interval_s = interval_s
        self.on_sample = on_sample
        self.clock = time.monotonic  # the running loop's clock from `start` (the edge's `now`)

    async def start(self) -> None:
        self.clock = asyncio.get_running_loop().time
        if self._task is None:
            self.gate.due = None  # no round due yet: a restart does not read the pause as lag
        await super().start()

    async def run_once(self) -> None:
        now = self.clock()
        due = self.gate.due
        if due is not None:  # not the first round: how late this one ran
            lag = max(0.0, now - due)
            self.gate.observe(lag, now)
            if self.on_sample is not None:
                self.on_sample(lag)
        self.gate.expect(now + self.interval_s)
