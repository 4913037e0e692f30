"""`pdorch serve --workers N` (N > 1): the supervisor's foreground loop.

Reserve the port, launch the fleet's engines once, start the N workers
(`pdorch.app.workers.WorkerSupervisor`), print what serves where (the usual banner, then one
line per worker with its private URL), restart workers that die, and on SIGTERM/SIGINT stop
the workers (each drains) and then the engines. Design: `pdorch/app/workers.py`.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from pdorch.config.fleet import FleetConfig


async def serve_workers(
    fleet: FleetConfig,
    *,
    workers: int,
    host: str | None,
    port: int | None,
    what: str,
    console: Console,
    as_json: bool,
    log_level: str,
) -> None:
    """Raises `pools.launch.FleetLaunchError` (an engine did not start), `OSError` (the port
    is taken) or `pdorch.app.workers.WorkerStartError` (a worker did not start)."""
    from pdorch.app.workers import WorkerSupervisor, reserve_port
    from pdorch.cli.serve_banner import print_started, started_line
    from pools.inloop_server import base_url
    from pools.launch import launch_fleet

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bind = host if host is not None else fleet.coordinator.host
    reserved = reserve_port(bind, port if port is not None else fleet.coordinator.port)
    try:
        shared_port = int(reserved.getsockname()[1])
        url = base_url(bind, shared_port)
        with console.status(f"starting the {what} ..."):
            launched = launch_fleet(fleet)
            running = await launched.__aenter__()
        try:
            supervisor = WorkerSupervisor(
                fleet, running.endpoints, bind, shared_port, workers, log_level=log_level
            )
            with console.status(f"starting {workers} coordinator workers ..."):
                await supervisor.start()
            try:
                if as_json:
                    started = {
                        **started_line(
                            url, fleet.served_model_name, fleet.model_names(), running.endpoints
                        ),
                        "workers": [slot.describe() for slot in supervisor.slots],
                    }
                    sys.stdout.write(json.dumps(started) + "\n")
                    sys.stdout.flush()
                print_started(
                    console,
                    what=what,
                    url=url,
                    models=fleet.model_names(),
                    endpoints=running.endpoints,
                    admin_token=fleet.coordinator.admin_token is not None,
                )
                console.print(
                    f"{workers} coordinator workers share port {shared_port} (SO_REUSEPORT) and "
                    "their token load; the fleet is fixed (scale/drain answer 409). Each "
                    "worker's own /metrics and /admin:"
                )
                for slot in supervisor.slots:
                    console.print(f"  worker {slot.index}: pid {slot.pid}  {slot.url}/metrics")
                console.print("Ctrl-C stops the workers and every engine this process started.")
                await stop.wait()
                console.print("stopping ...")
            finally:
                await supervisor.stop()
        finally:
            await launched.__aexit__(None, None, None)
    finally:
        reserved.close()
