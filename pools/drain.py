"""Drain: take a replica out of routing and wait until it holds no work, so it can stop.

The seam between routing and actuation. The coordinator owns one `RequestTracker` and tells it,
per client request, which replicas the request is using (its prefill replica until the decode
leg's first byte, by which time the decode engine has pulled the KV; its decode replica until
the last byte) and how to cut the request short (`cut`: a stream ends with an OpenAI error
event). Actuators (`autoscale.actuators.local`) read it through `drain_replica`, never the
coordinator itself, so `autoscale` needs only `pools`.

`drain_replica(fleet, replica_id, tracker, timeout_s, ...)`:

1. `Fleet.set_draining`: the replica leaves routing for new requests at once;
2. poll (every `poll_s`) until the tracker counts no request on it **and** the engine holds no
   KV lease (`GET /sim/info` → `num_held_requests` on simulated engines; engines without that
   endpoint, vLLM, count as holding none once no request uses them: the decode leg's first
   byte means the pull is done, and vLLM frees an unpulled lease itself after `kv_lease_s`);
3. past `timeout_s`: `RequestTracker.cut` ends every request still on it (streams get an
   OpenAI error event and `[DONE]`: never silently truncated; the coordinator answers a
   non-streamed request 503 `replica_drained` with the reason), waits up to `cut_grace_s`
   for them to unwind, and reports `timed_out`.

The caller then stops the process (scale-down) or re-labels the replica (role switch).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from pools.fleet import Fleet

CutCallback = Callable[[str], None]
"""Ends one request early; the argument is the reason shown to the client."""


class RequestTracker:
    """Client requests by replica (see module docstring); pure bookkeeping, no I/O."""

    def __init__(self) -> None:
        self._by_replica: dict[str, dict[str, CutCallback | None]] = {}

    def begin(self, replica_id: str, request_id: str, cut: CutCallback | None = None) -> None:
        self._by_replica.setdefault(replica_id, {})[request_id] = cut

    def end(self, replica_id: str, request_id: str) -> None:
        requests = self._by_replica.get(replica_id)
        if requests is not None:
            requests.pop(request_id, None)
            if not requests:
                del self._by_replica[replica_id]

    def in_flight(self, replica_id: str) -> int:
        return len(self._by_replica.get(replica_id, ()))

    def cut(self, replica_id: str, reason: str) -> int:
        """Cut every request on `replica_id` that can be cut; returns how many."""
        n = 0
        for cut in list(self._by_replica.get(replica_id, {}).values()):
            if cut is not None:
                cut(reason)
                n += 1
        return n


@dataclass(frozen=True, slots=True)
class DrainOutcome:
    replica_id: str
    duration_s: float
    timed_out: bool
    cut: int  # requests ended early with an error (0 unless timed_out)


async def held_leases(client: httpx.AsyncClient, url: str, timeout_s: float = 2.0) -> int:
    """KV leases the engine at `url` still holds (`/sim/info`); 0 when it cannot say."""
    with contextlib.suppress(httpx.HTTPError, ValueError):
        response = await client.get(f"{url.rstrip('/')}/sim/info", timeout=timeout_s)
        if response.status_code == 200:
            value = response.json().get("num_held_requests", 0)
            return int(value) if isinstance(value, int) else 0
    return 0


async def drain_replica(
    fleet: Fleet,
    replica_id: str,
    tracker: RequestTracker,
    timeout_s: float,
    *,
    client: httpx.AsyncClient,
    clock: Callable[[], float] = time.monotonic,
    poll_s: float = 0.05,
    cut_grace_s: float = 5.0,
) -> DrainOutcome:
    """Drain one replica (see module docstring); KeyError if it is not in the fleet."""
    started = clock()
    replica = fleet.set_draining(replica_id, started)
    url = replica.url
    deadline = started + timeout_s
    while True:
        if tracker.in_flight(replica_id) == 0 and await held_leases(client, url) == 0:
            return DrainOutcome(replica_id, clock() - started, False, 0)
        if clock() >= deadline:
            break
        await asyncio.sleep(poll_s)
    cut = tracker.cut(
        replica_id, f"replica {replica_id} drained past drain_timeout_s={timeout_s:g}"
    )
    grace = clock() + cut_grace_s
    while tracker.in_flight(replica_id) and clock() < grace:  # noqa: ASYNC110  (a poll with a deadline)
        await asyncio.sleep(poll_s)
    return DrainOutcome(replica_id, clock() - started, True, cut)
