"""The health checker: probes every replica's `/health` and feeds `Fleet.observe_probe`.

A probe is one GET with a short timeout (default 0.5 s) every `interval_s` (default 0.25 s),
all replicas concurrently on one shared client: an `httpx.AsyncClient`, or an
`aiohttp.ClientSession` (the coordinator's legs session: a probe costs ~4x less CPU there).
A stopped engine refuses the connection at once, so it leaves routing on the next round
(≤ `interval_s` + a round's time, within the 1 s budget); a hung one once
`probe_timeouts_to_eject` (2) probes in a row time out (about twice `interval_s` +
`timeout_s`, within the 3 s budget). The replica returns as soon as
`HealthPolicy.probe_successes_to_restore` probes pass. The ejection rules themselves live in
`pools.fleet` (pure); this module only does the I/O.

Engine faults vs request faults (issue 14): what the request path feeds `Fleet.report_failure`
is filtered by the coordinator (`pdorch.app.faults.RequestFaults`), so one client cannot eject
a replica by sending a request the engine refuses or cannot process:
- a 4xx answer is the request's fault: passed to the client, never counted;
- a refused/reset connection or a timeout is the engine's: counted at once;
- a 5xx answer counts only when another replica then serves the same request (the request was
  fine); a 5xx that no replica gets past is the request's and is forgiven. An engine broken for
  every request is still ejected: by this checker (vLLM's `/health` is non-200 once its engine
  core died) or by its confirmed 5xx (`http_failures_to_eject` in a row).
Probes are the engine's own status and are never filtered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp
import httpx
from pydantic import BaseModel, ConfigDict, Field

from pools.fleet import FailureKind, Fleet, HealthPolicy
from pools.periodic import PeriodicLoop
from pools.replica import Replica


class HealthSettings(BaseModel):
    """Probe loop timing and the ejection thresholds (the fleet config's `health:` block)."""

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(
        default=0.25, gt=0, le=60, description="Seconds between probe rounds."
    )
    timeout_s: float = Field(default=0.5, gt=0, le=60, description="Timeout of one /health probe.")
    connection_failures_to_eject: int = Field(
        default=1, ge=1, description="Consecutive connection errors (request path) that eject."
    )
    timeout_failures_to_eject: int = Field(
        default=2, ge=1, description="Consecutive timeouts (request path) that eject."
    )
    http_failures_to_eject: int = Field(
        default=3, ge=1, description="Consecutive HTTP 5xx answers (request path) that eject."
    )
    probe_failures_to_eject: int = Field(
        default=1, ge=1, description="Consecutive failed /health probes that eject."
    )
    probe_timeouts_to_eject: int = Field(
        default=2,
        ge=1,
        description="Consecutive /health probes that time out that eject (one late probe on a "
        "busy host is not a hung engine).",
    )
    probe_successes_to_restore: int = Field(
        default=1, ge=1, description="Consecutive good /health probes that bring a replica back."
    )

    def policy(self) -> HealthPolicy:
        return HealthPolicy(
            connection_failures_to_eject=self.connection_failures_to_eject,
            timeout_failures_to_eject=self.timeout_failures_to_eject,
            http_failures_to_eject=self.http_failures_to_eject,
            probe_failures_to_eject=self.probe_failures_to_eject,
            probe_timeouts_to_eject=self.probe_timeouts_to_eject,
            probe_successes_to_restore=self.probe_successes_to_restore,
        )


def classify_error(exc: BaseException) -> FailureKind:
    """Map an httpx or aiohttp error to the failure kind the ejection rules count.

    Timeouts: `httpx.TimeoutException`, aiohttp's `ServerTimeoutError` (connect and socket-read
    timeouts; a `TimeoutError` subclass) and any other `TimeoutError`. Everything else
    (refused/reset connections, disconnects, protocol and payload errors) is a connection
    failure.
    """
    if isinstance(exc, httpx.TimeoutException | aiohttp.ServerTimeoutError | TimeoutError):
        return FailureKind.TIMEOUT
    return FailureKind.CONNECTION


class HealthChecker(PeriodicLoop):
    """Runs `/health` probes over the fleet every `interval_s` until stopped."""

    def __init__(
        self,
        fleet: Fleet,
        client: httpx.AsyncClient | aiohttp.ClientSession,
        interval_s: float = 0.25,
        timeout_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fleet = fleet
        self.client = client
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.rounds = 0
        super().__init__()

    @classmethod
    def from_config(
        cls,
        fleet: Fleet,
        client: httpx.AsyncClient | aiohttp.ClientSession,
        settings: HealthSettings,
    ) -> HealthChecker:
        return cls(fleet, client, interval_s=settings.interval_s, timeout_s=settings.timeout_s)

    async def probe(self, replica: Replica) -> tuple[bool, FailureKind | None, str]:
        """One probe: (ok, failure kind, detail). HTTP 200 is healthy, anything else is not."""
        client = self.client
        if isinstance(client, aiohttp.ClientSession):
            return await self._probe_aiohttp(client, replica)
        try:
            response = await client.get(replica.endpoint.health_endpoint, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            return False, classify_error(exc), type(exc).__name__
        if response.status_code == 200:
            return True, None, ""
        return False, FailureKind.HTTP_5XX, f"/health answered {response.status_code}"

    async def _probe_aiohttp(
        self, session: aiohttp.ClientSession, replica: Replica
    ) -> tuple[bool, FailureKind | None, str]:
        # per phase, as httpx's `timeout=`: pool + connect, then each read (not a total)
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.timeout_s, sock_read=self.timeout_s
        )
        try:
            async with session.get(replica.endpoint.health_endpoint, timeout=timeout) as response:
                status = response.status
                await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return False, classify_error(exc), type(exc).__name__
        if status == 200:
            return True, None, ""
        return False, FailureKind.HTTP_5XX, f"/health answered {status}"

    async def check_once(self) -> None:
        """Probe every replica once, concurrently, and record the results."""
        replicas = self.fleet.replicas()
        results = await asyncio.gather(*(self.probe(r) for r in replicas))
        now = self.clock()
        for replica, (ok, kind, detail) in zip(replicas, results, strict=True):
            self.fleet.observe_probe(replica.replica_id, ok, now, kind=kind, detail=detail)
        self.rounds += 1

    async def run_once(self) -> None:
        await self.check_once()
