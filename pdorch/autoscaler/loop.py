"""The live control loop: every `interval_s`, observe → plan → apply, one decision per tick.

```
source.observe(now)  →  planner.plan(observation)  →  driver.apply(decision, observation)
```

The source (`pdorch/autoscaler/source.py`) is a metrics source of `autoscale/metrics_sources/`
with the actuator's pool counts. A source that windows since its last read primes on its first
read (`window_s` 0: no arrivals, no latencies); that tick is not planned (`tick` returns None):
an empty window would read as an idle fleet, feed the forecaster a zero rate and start the
planner's scale-down clock before it has watched any load. `first_decision` (`--once`) reads
again `interval_s` later.

Drivers (where a decision goes):
- `AdminApiDriver`: the coordinator's admin API (`POST /admin/pools/{pool}/scale` with
  `source: autoscaler`, the reason and the inputs; role moves `POST /admin/replicas/{id}/move`
  for a switchable ready replica of the giving pool): `pdorch autoscale` as its own process;
- `InProcessDriver`: the coordinator's `ScalingControl` directly (`pdorch serve --slo-policy`);
- `DryRunDriver`: prints the decision, changes nothing (`--dry-run`).

Every decision is recorded by the coordinator (`GET /admin/autoscale`), pinned pools (a manual
`pdorch scale set`) included, with reason `pinned`. The planner is pure; the loop is the only
place with a clock and sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from autoscale.decision import ScaleDecision
from autoscale.metrics_sources.base import MetricsSource
from autoscale.planner_base import Planner
from autoscale.signals import Observation
from pools.http_client import http_client

log = logging.getLogger(__name__)


def decision_inputs(decision: ScaleDecision, obs: Observation) -> dict[str, Any]:
    """What a recorded decision carries: the observation's summary and the planner's details."""
    return {
        "arrival_rps": round(obs.arrival_rps, 4),
        "pools": {
            str(p): {"ready": s.ready, "pending": s.pending, "draining": s.draining}
            for p, s in obs.pools.items()
        },
        "replicas": [
            {
                "id": r.replica_id,
                "pool": str(r.pool),
                "num_running": r.num_running,
                "num_waiting": r.num_waiting,
                "kv_usage": r.kv_usage,
            }
            for r in obs.replicas
        ],
        "observed": {
            "ttft_p90_s": obs.ttft.p90_s,
            "itl_p90_s": obs.itl.p90_s,
            "window_s": round(obs.window_s, 3),
        },
        "details": _plain(decision.details),
    }


def _plain(value: Any) -> Any:
    """JSON-safe copy of planner details (enums to strings, tuples to lists)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


class Driver(Protocol):
    async def apply(self, decision: ScaleDecision, obs: Observation) -> None: ...


class AdminApiDriver:
    def __init__(self, url: str, admin_token: str | None, model: str | None = None) -> None:
        headers = {"authorization": f"Bearer {admin_token}"} if admin_token else {}
        # `model`: one model of a several-model coordinator (`?model=` on every admin call)
        params = {"model": model} if model else None
        self.client = http_client(
            base_url=url.rstrip("/"), headers=headers, params=params, timeout=30.0
        )

    async def apply(self, decision: ScaleDecision, obs: Observation) -> None:
        inputs = decision_inputs(decision, obs)
        if decision.moves:
            view = (await self.client.get("/admin/autoscale")).raise_for_status().json()
            for move in decision.moves:
                rows = view["pools"].get(str(move.from_pool), {}).get("replicas", [])
                ids = [r["id"] for r in rows if r["switchable"] and r["state"] == "healthy"]
                for replica_id in ids[: move.count]:
                    answer = await self.client.post(
                        f"/admin/replicas/{replica_id}/move", json={"to": str(move.to_pool)}
                    )
                    if answer.status_code >= 400:
                        log.warning("move %s refused: %s", replica_id, answer.text)
        for pool, replicas in decision.desired.items():
            answer = await self.client.post(
                f"/admin/pools/{pool}/scale",
                json={
                    "replicas": replicas,
                    "source": "autoscaler",
                    "reason": decision.reasons.get(pool, "planner"),
                    "inputs": inputs,
                },
            )
            if answer.status_code >= 400:
                log.warning("scale %s to %d refused: %s", pool, replicas, answer.text)

    async def aclose(self) -> None:
        await self.client.aclose()


class InProcessDriver:
    def __init__(self, scaling: Any) -> None:
        self.scaling = scaling  # pdorch.app.scaling.ScalingControl

    async def apply(self, decision: ScaleDecision, obs: Observation) -> None:
        from pdorch.app.errors import ApiError

        self.scaling.autoscaler = "in-process"
        inputs = decision_inputs(decision, obs)
        for move in decision.moves:
            for replica_id in self.scaling.actuator.switchable(str(move.from_pool))[: move.count]:
                try:
                    self.scaling.move(replica_id, str(move.to_pool))
                except ApiError as err:
                    log.warning("move %s refused: %s", replica_id, err.message)
        for pool, replicas in decision.desired.items():
            try:
                self.scaling.set(
                    str(pool),
                    replicas=replicas,
                    source="autoscaler",
                    reason=decision.reasons.get(pool, "planner"),
                    inputs=inputs,
                )
            except ApiError as err:
                log.warning("scale %s to %d refused: %s", pool, replicas, err.message)


class DryRunDriver:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    async def apply(self, decision: ScaleDecision, obs: Observation) -> None:
        for pool, replicas in decision.desired.items():
            have = obs.pool(pool).provisioned
            why = decision.reasons.get(pool, "planner")
            self.out.write(f"dry-run: pool {pool}: {have} → {replicas} ({why})\n")
        for move in decision.moves:
            self.out.write(f"dry-run: move {move.count} {move.from_pool} → {move.to_pool}\n")
        self.out.flush()


class ControlLoop:
    """observe → plan → apply every `interval_s` (see the module docstring)."""

    def __init__(
        self,
        planner: Planner,
        source: MetricsSource,
        driver: Driver,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.planner = planner
        self.source = source
        self.driver = driver
        self.interval_s = interval_s
        self.clock = clock
        self.decisions: list[ScaleDecision] = []

    async def tick(self) -> ScaleDecision | None:
        """One observe → plan → apply; None when the observation only primed the source."""
        obs = await self.source.observe(self.clock())
        if obs.window_s <= 0:
            return None
        decision = self.planner.plan(obs)
        await self.driver.apply(decision, obs)
        self.decisions.append(decision)
        return decision

    async def first_decision(self) -> ScaleDecision:
        """Tick until one is planned (the second read of a source that primes on its first)."""
        decision = await self.tick()
        while decision is None:
            await asyncio.sleep(self.interval_s)
            decision = await self.tick()
        return decision

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:  # one bad tick (coordinator restarting) must not end the loop
                log.exception("autoscaler tick failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
