"""The one interface every metrics source implements, so one control loop reads any of them.

A source turns the live fleet into an `Observation` (`autoscale/signals.py`), the only thing a
planner reads. `observe(now)` is async because every live source does HTTP; the control loop
is asyncio. `now` is the control loop's clock (the value the planner gets as
`Observation.now`); a source never reads a clock of its own for the observation's time, but
it measures its window on that same `now`.

Window semantics (each source's docstring says which it uses):
- *since the last call* (`CoordinatorSource`, `EngineScrapeSource`): counters and cumulative
  histograms are differenced between two reads, so `window_s = now - previous now`. The first
  call primes the baseline and returns `window_s = 0`, no requests and no latencies (gauges
  such as replica counts and KV usage are filled).
- *fixed lookback* (`PrometheusSource`): PromQL `rate(...[window_s])` at the query time, so
  every call returns the last `window_s` seconds (Prometheus extrapolates the window's edges).

`Observation.pools` is the source's own view of ready / pending / draining replicas; a
control loop that drives an actuator may replace it with `actuator.current()`
(`dataclasses.replace(obs, pools=...)`), the actuator being the authority on what it started.
A source that cannot reach its backend raises `MetricsSourceError`; the loop decides whether
to skip the tick.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from autoscale.signals import Observation

# Per HTTP read of a source (a coordinator's or engine's /metrics, a PromQL query): Prometheus'
# own default scrape_timeout. 2 s failed `pdorch autoscale --once` in CI: a coordinator sharing
# 2 cores with two vLLM engines (NIXL's progress thread spins a core each) answered /metrics
# after more than 2 s. A control loop ticking every 5-30 s can afford to wait.
SCRAPE_TIMEOUT_S = 10.0


class MetricsSourceError(RuntimeError):
    """The source could not read its backend (connection, HTTP status, unparsable answer)."""


class MetricsSource(ABC):
    """Base class of metrics sources (see the module docstring)."""

    name: str = "source"

    @abstractmethod
    async def observe(self, now: float) -> Observation:
        """The fleet over the source's window ending at `now`."""

    async def aclose(self) -> None:  # noqa: B027  (optional hook: sources without a client)
        """Release the source's HTTP client (idempotent)."""

    async def __aenter__(self) -> MetricsSource:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
