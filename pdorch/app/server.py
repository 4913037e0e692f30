"""Run the coordinator: its HTTP server on the running event loop, and a whole fleet + server.

```python
async with run_coordinator(config, port=0) as running:   # engines, coordinator, HTTP server
    running.url                      # "http://127.0.0.1:<port>"
    running.coordinator              # router state, fleet, metrics (tests, benchmarks)
    running.app                      # its FastAPI app (routes: the OpenAPI and auth tests)
    running.fleet                    # pools.launch.RunningFleet (launched engines)
# on exit: server stopped, coordinator stopped, every engine it launched stopped
```

`coordinator_http_server(app, host, port)` alone serves an app for a fleet someone else owns
(`pools.inloop_server.InLoopHttpServer` with the coordinator's settings). `port=0` binds before
serving (the OS picks), so starts never race.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI
from starlette.types import ASGIApp

from autoscale.actuators.local import LocalActuator
from autoscale.policy import SloPolicy, load_policy
from pdorch.app.admission import CoordinatorLimits
from pdorch.app.api import CoordinatorApp, create_app
from pdorch.app.auth import open_admin_warning
from pdorch.app.edge import edge_protocol
from pdorch.app.head_shed import HeadShed, LagProbe
from pdorch.app.models import ModelDispatch
from pdorch.app.scaling import ScalingControl
from pdorch.app.state import Coordinator
from pdorch.config.coordinator import CoordinatorSettings
from pdorch.config.fleet import FleetConfig
from pools.inloop_server import InLoopHttpServer
from pools.launch import RunningFleet, launch_fleet
from pools.replica import ReplicaEndpoint

log = logging.getLogger(__name__)


def coordinator_http_server(
    app: ASGIApp,
    host: str = "127.0.0.1",
    port: int = 8000,
    settings: CoordinatorSettings | None = None,
    *,
    reuse_port: bool = False,
    head_shed: HeadShed | None = None,
) -> InLoopHttpServer:
    """The coordinator's HTTP server: `pools.inloop_server.InLoopHttpServer` with its settings.

    The listen backlog `settings.listen_backlog` (1024: the kernel queues that many completed
    connects while the loop is busy; they wait there unprioritised, ahead of every deadline and
    shed, so it is not sized to the whole `max_connections`), keep-alive 30 s (clients reuse
    connections between requests; the engines' side keeps uvicorn's 5 s), 2 s for open streams
    at shutdown; the connection limits of `settings` (`edge.py`: connections, header and body
    deadlines; defaults when None; `settings.edge_fast_path`: the OpenAI POSTs served from the
    protocol, `edge_fast.py`); `head_shed`: 429 at the request head (`head_shed.py`;
    the edge counts heads in and out of its `pending`); `reuse_port`: `SO_REUSEPORT` (the
    workers of `pdorch serve --workers`). `app`: any ASGI callable (the coordinator's
    FastAPI app, `api.create_app`).
    """
    settings = settings if settings is not None else CoordinatorSettings()
    # the fast path calls the coordinator app's request logic itself (edge_fast.py): only for
    # pdorch's own app, whose POSTs no middleware sees either way (`CoordinatorApp.__call__`)
    fast = app.serve_post if settings.edge_fast_path and isinstance(app, CoordinatorApp) else None
    return InLoopHttpServer(
        app,
        host,
        port,
        backlog=settings.listen_backlog,
        keep_alive_s=30,
        graceful_shutdown_s=2,
        http=edge_protocol(settings, head_shed, fast),
        reuse_port=reuse_port,
    )


@dataclass
class RunningCoordinator:
    """`coordinator`/`fleet`: the (first) model's; `models`: every model's, by served name
    (one entry unless the fleet file lists `models:`)."""

    url: str
    coordinator: Coordinator
    fleet: RunningFleet
    server: InLoopHttpServer
    app: FastAPI  # what `server` serves: its routes are the coordinator's
    models: dict[str, tuple[Coordinator, RunningFleet]] = field(default_factory=dict)
    head_shed: HeadShed | None = None  # the edge's shedding, shared by every socket it serves

    @property
    def endpoints(self) -> list[ReplicaEndpoint]:
        """Every model's launched and static replicas at start, in model order."""
        return [e for _, running in self.models.values() for e in running.endpoints]


@contextlib.asynccontextmanager
async def run_coordinator(
    config: FleetConfig,
    *,
    host: str | None = None,
    port: int | None = None,
    log_dir: Path | None = None,
    origin: str | None = None,
    limits: CoordinatorLimits | None = None,
    slo_policy: SloPolicy | None = None,
    reuse_port: bool = False,
) -> AsyncIterator[RunningCoordinator]:
    """Launch the fleet's engines, start the coordinator and its HTTP server; stop all on exit.

    `limits` overrides the admission limits read from `config.coordinator`. When a pool
    launches engines, the coordinator gets a `ScalingControl` over a `LocalActuator`
    (`coordinator.scaling`), bounded by `slo_policy`'s pool limits (default: the file's
    `slo_policy`, else `PoolLimits`). With a `discovery:` section,
    `pools.kubernetes.discovery.KubernetesDiscovery` keeps the fleet in step with the engine
    pods (`coordinator.discovery`). A file with `models:` runs one coordinator per model (each
    with its own engines, logs under `log_dir/<model>`, and its own `slo_policy`) behind one
    HTTP server that routes by `model` (`pdorch/app/models.py`). `reuse_port`: bind the
    HTTP socket with `SO_REUSEPORT` (one worker of `pdorch serve --workers N`).
    """
    configs = config.model_configs()
    several = len(configs) > 1
    async with contextlib.AsyncExitStack() as stack:
        models: dict[str, tuple[Coordinator, RunningFleet]] = {}
        for model in configs:
            name = model.served_model_name
            policy = slo_policy
            if model.slo_policy is not None and (several or policy is None):
                policy = load_policy(model.slo_policy)
            models[name] = await stack.enter_async_context(
                _run_model(
                    model,
                    log_dir=log_dir / name if several and log_dir is not None else log_dir,
                    origin=origin,
                    limits=limits,
                    slo_policy=policy,
                )
            )
        coordinator, running = next(iter(models.values()))
        dispatch = ModelDispatch([c for c, _ in models.values()]) if several else None
        bind = host if host is not None else config.coordinator.host
        head_shed = HeadShed.from_settings(config.coordinator.head_shed)
        head_shed.on_shed = coordinator.metrics.rejected
        probe = LagProbe(
            head_shed.gate,
            config.coordinator.head_shed.probe_interval_s,
            coordinator.metrics.loop_lag.set,
        )
        app = create_app(coordinator, dispatch)
        server = coordinator_http_server(
            app,
            bind,
            port if port is not None else config.coordinator.port,
            config.coordinator,
            reuse_port=reuse_port,
            head_shed=head_shed,
        )
        if (warning := open_admin_warning(bind, config.coordinator.admin_token)) is not None:
            log.warning(warning)
        try:
            url = await server.start()
            await probe.start()
            yield RunningCoordinator(url, coordinator, running, server, app, models, head_shed)
        finally:
            await probe.stop()
            await server.stop()


@contextlib.asynccontextmanager
async def _run_model(
    config: FleetConfig,
    *,
    log_dir: Path | None,
    origin: str | None,
    limits: CoordinatorLimits | None,
    slo_policy: SloPolicy | None,
) -> AsyncIterator[tuple[Coordinator, RunningFleet]]:
    """One model's engines, coordinator, scaling control and discovery (no HTTP server)."""
    async with launch_fleet(config, log_dir=log_dir) as running:
        fleet = running.fleet(time.monotonic(), config.health.policy())
        coordinator = Coordinator(config, fleet, origin=origin, limits=limits)
        await coordinator.start()
        actuator: LocalActuator | None = None
        if running.templates:
            actuator = LocalActuator(
                fleet,
                running,
                coordinator.requests,
                policy=slo_policy,
                join_check=coordinator.kv_events_live,
                client=coordinator.client,
            )
            coordinator.scaling = ScalingControl(actuator)
        discovery = None
        if config.discovery is not None:
            try:
                from pools.kubernetes.discovery import KubernetesDiscovery
            except ImportError as err:
                raise RuntimeError(
                    "discovery: kind kubernetes needs the official client: "
                    f"pip install 'pdorch[kubernetes]' ({err})"
                ) from err

            discovery = KubernetesDiscovery(
                config.discovery,
                fleet,
                coordinator.requests,
                model=config.served_model_name,
                block_size=config.block_size,
                client=coordinator.client,
                join_check=coordinator.kv_events_live,
            )
            await discovery.start()
            coordinator.discovery = discovery
        try:
            yield coordinator, running
        finally:
            if discovery is not None:
                await discovery.stop()
            if actuator is not None:
                await actuator.aclose()
            await coordinator.stop()
