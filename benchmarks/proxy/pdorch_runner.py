"""Run the pdorch coordinator over a fleet file in the foreground (the proxy benchmark's
fallback when this checkout has no `pdorch serve` yet): the same `run_coordinator` path.

    python -m benchmarks.proxy.pdorch_runner --config FLEET.yaml --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import Any


async def _serve(config_path: str, port: int) -> None:
    from pdorch.app.gc_tuning import tune_gc_for_serving
    from pdorch.app.server import run_coordinator
    from pdorch.config.fleet import load_fleet_config

    config = load_fleet_config(config_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with run_coordinator(config, port=port) as running:
        tune_gc_for_serving()  # as `pdorch serve` does
        print(f"ready {running.url}", flush=True)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    run: Any = asyncio.run
    try:
        import uvloop  # as `pdorch serve` does, when installed

        run = uvloop.run
    except ImportError:
        pass
    with contextlib.suppress(KeyboardInterrupt):
        run(_serve(args.config, args.port))


if __name__ == "__main__":
    main()
