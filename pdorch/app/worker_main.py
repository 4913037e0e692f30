"""One worker of `pdorch serve --workers N` (`python -m pdorch.app.worker_main SPEC.json`).

Started by `pdorch.app.workers.WorkerSupervisor`, never by hand. SPEC is a JSON object:
`{index, workers, host, port, private_port, log_level, fleet}` (`fleet`: the worker's fleet
file as a mapping, `workers.worker_fleet_config`). The worker runs one whole coordinator over
that fleet (static endpoints, `sync:` with its sibling workers), listening on `host:port` with
`SO_REUSEPORT` and on `host:private_port` (its own `/metrics` and `/admin`), prints one JSON
line `{"pid", "url", "sync"}` on stdout once both accept connections, and on SIGTERM/SIGINT
stops accepting, lets open requests finish (the coordinator's 2 s) and exits 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("pdorch.worker")


def _die_with_parent() -> None:
    """Ask Linux for SIGTERM when the supervisor dies (no orphan keeps the port); elsewhere a
    no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


async def serve_worker(spec: dict[str, Any]) -> None:
    from pdorch.app.gc_tuning import tune_gc_for_serving
    from pdorch.app.server import coordinator_http_server, run_coordinator
    from pdorch.app.workers import FIXED_FLEET
    from pdorch.config.fleet import parse_fleet_config

    index, workers = int(spec["index"]), int(spec["workers"])
    fleet = parse_fleet_config(spec["fleet"], source=f"worker {index}'s fleet")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    host = str(spec["host"])
    async with run_coordinator(
        fleet, host=host, port=int(spec["port"]), reuse_port=True
    ) as running:
        for coordinator, _ in running.models.values():
            coordinator.fixed_fleet = FIXED_FLEET.format(n=workers)
        private = coordinator_http_server(
            running.app,
            host,
            int(spec["private_port"]),
            fleet.coordinator,
            head_shed=running.head_shed,
        )
        await private.start()
        try:
            tune_gc_for_serving()  # as a single `pdorch serve` does (gc_tuning.py)
            sync = running.coordinator.sync
            ready = {"pid": os.getpid(), "url": private.url, "sync": sync and sync.endpoint}
            sys.stdout.write(json.dumps(ready) + "\n")
            sys.stdout.flush()
            await stop.wait()
            # both sockets stop accepting at once, then open requests finish on each
            running.server.request_stop()
            private.request_stop()
        finally:
            await private.stop()


def main() -> None:
    _die_with_parent()
    spec = json.loads(Path(sys.argv[1]).read_text())
    logging.basicConfig(
        level=str(spec.get("log_level", "warning")).upper(),
        stream=sys.stderr,
        format=f"worker {spec['index']}: %(levelname)s:%(name)s:%(message)s",
    )
    run: Any = asyncio.run
    try:
        import uvloop  # as `pdorch serve` does, when installed

        run = uvloop.run
    except ImportError:
        pass
    run(serve_worker(spec))


if __name__ == "__main__":
    main()
