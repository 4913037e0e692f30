"""Idle CPU of `pdorch serve` with 1 and with N workers over the same engines, side by side.

`python -m benchmarks.proxy.idle_cpu --workers 1,2 --seconds 30`: two simulated engines (as
`pdorch bench proxy` starts them), then one `pdorch serve --workers N` per value, all at once;
after they serve, each one's CPU seconds (the supervisor and its workers) over the same idle
window, printed as one JSON object `{"seconds", "loadavg_1m", "rows": [{"workers",
"cpu_ms_per_s"}]}`. What it shows: the per-process background (health probes, engine metrics
scrapes, KV-event sockets, the sync's 20 ms flush timer and heartbeats) that `bench proxy`'s
CPU per request also divides among the requests, so at low req/s it weighs heavily there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

from benchmarks.proxy.processes import (
    RunningProcess,
    start_pdorch,
    start_sim,
    stop_process,
    write_pdorch_fleet,
)
from benchmarks.proxy_bench import _cpu_s
from pools.ports import free_port


async def measure(workers: list[int], seconds: float) -> dict[str, object]:
    log_dir = Path(tempfile.mkdtemp(prefix="pdorch-idle-cpu-"))
    started: list[RunningProcess] = []
    try:
        for role in ("prefill", "decode"):
            started.append(
                await start_sim(
                    role,
                    log_dir,
                    time_scale=0.0001,
                    model_profile="tiny",
                    served_model_name="bench-model",
                    kv_events_port=free_port(),
                )
            )
        prefill, decode = started
        fleet = log_dir / "fleet.yaml"
        write_pdorch_fleet(
            fleet, served_model_name="bench-model", prefill=prefill, decode=decode, port=0
        )
        coordinators = []
        for n in workers:
            coordinators.append(await start_pdorch(fleet, free_port(), log_dir, workers=n))
            started.append(coordinators[-1])
        await asyncio.sleep(3.0)  # past start-up work (imports, first probes, GC freeze)
        before = [_cpu_s([c.pid]) for c in coordinators]
        t0 = time.monotonic()
        await asyncio.sleep(seconds)
        wall = time.monotonic() - t0
        after = [_cpu_s([c.pid]) for c in coordinators]
        rows = [
            {"workers": n, "cpu_ms_per_s": round((a - b) / wall * 1e3, 1)}
            for n, a, b in zip(workers, after, before, strict=True)
        ]
        return {"seconds": round(wall, 1), "loadavg_1m": os.getloadavg()[0], "rows": rows}
    finally:
        for proc in reversed(started):
            stop_process(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--seconds", type=float, default=30.0, help="idle window (s)")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    print(json.dumps(asyncio.run(measure(counts, args.seconds))))


if __name__ == "__main__":
    main()
