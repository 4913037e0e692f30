"""The planners of one `pdorch bench autoscale` run, one after another or in worker processes.

    runs = run_planners(workload, policy, names, config, requests, jobs=2, progress=on_progress)

`jobs` 1 runs them one after another in this process (what the command always did). `jobs` N
runs them in min(N, planners) worker processes: each planner is one task, the result dicts
come back in `names` order, so `results.json` and `--json` are the same as with one job (the
simulator is deterministic; only the run's own timings, `sim_wall_s` / `sim_cpu_s` /
`plan_cpu_s` / `wall_s`, differ; `tests/benchmarks/test_autoscale_jobs.py` checks it).

Why fork, and why the inputs are not sent to the workers: the whole Azure hour is 271k
requests and the 2-hour diurnal day 374k; pickling that workload to every worker would cost
seconds and memory per task, while forked workers inherit the parent's objects (copy on
write). Fork also keeps the parent's string-hash seed, so nothing that iterates a set of
strings can order differently in a worker. The pool is forked before the caller starts its
progress display (whose refresh thread a fork would otherwise copy mid-lock).

Progress: each worker sends `(name, virtual_t)` on a queue at most every `PROGRESS_EVERY_S`
of wall time; the parent drains it and calls `progress(name, t)`, and `done(name, result)`
as each planner finishes.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import time
from collections.abc import Callable
from multiprocessing.pool import AsyncResult, Pool
from typing import Any

from autoscale.policy import SloPolicy
from benchmarks.autoscale_sim.runner import AutoscaleSimConfig, run_planner
from benchmarks.workloads.model import Workload

__all__ = ["PlannerPool", "run_planners"]

PROGRESS_EVERY_S = 0.5
"""Wall seconds between a worker's progress messages (the bar needs no more)."""
POLL_S = 0.2
"""How long the parent waits on the progress queue before it checks for finished planners."""

Requests = list[tuple[float, int, int, float]]
Progress = Callable[[str, float], None]
Done = Callable[[str, dict[str, Any]], None]

# The run's inputs, set in the parent before the fork; workers read their inherited copy.
_INPUTS: dict[str, Any] = {}


def _worker_init(progress_queue: Any) -> None:
    _INPUTS["queue"] = progress_queue


def _run_in_worker(name: str) -> dict[str, Any]:
    q = _INPUTS["queue"]
    last = [0.0]

    def tick(t: float) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S:
            last[0] = now
            q.put((name, t))

    return run_planner(
        _INPUTS["workload"],
        _INPUTS["policy"],
        name,
        _INPUTS["config"],
        progress=tick,
        requests=_INPUTS["requests"],
    )


class PlannerPool:
    """`jobs` forked workers holding one run's inputs; `run` gives the planners' results.

    Create it before any thread starts in this process (module docstring), use it as a
    context manager (the workers are terminated on exit).
    """

    def __init__(
        self,
        workload: Workload,
        policy: SloPolicy,
        config: AutoscaleSimConfig,
        requests: Requests,
        jobs: int,
    ) -> None:
        self._args = (workload, policy, config, requests)
        self._pool: Pool | None = None
        self._queue: Any = None
        if jobs > 1:
            ctx = multiprocessing.get_context("fork")
            self._queue = ctx.Queue()
            _INPUTS.update(workload=workload, policy=policy, config=config, requests=requests)
            try:
                self._pool = ctx.Pool(jobs, initializer=_worker_init, initargs=(self._queue,))
            finally:
                _INPUTS.clear()  # the parent keeps no second reference to the workload

    def __enter__(self) -> PlannerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def run(self, names: list[str], progress: Progress, done: Done) -> dict[str, dict[str, Any]]:
        """Every planner's result dict, in `names` order; a planner's error is raised here."""
        workload, policy, config, requests = self._args
        results: dict[str, dict[str, Any]] = {}
        if self._pool is None:
            for name in names:

                def tick(t: float, name: str = name) -> None:
                    progress(name, t)

                res = run_planner(workload, policy, name, config, progress=tick, requests=requests)
                results[name] = res
                done(name, res)
            return results
        pending: dict[str, AsyncResult[dict[str, Any]]] = {
            name: self._pool.apply_async(_run_in_worker, (name,)) for name in names
        }
        while pending:
            try:
                name, t = self._queue.get(timeout=POLL_S)
            except queue_module.Empty:
                pass
            else:
                if name in pending:  # a message may trail its planner's result
                    progress(name, t)
            for name in [n for n, r in pending.items() if r.ready()]:
                res = pending.pop(name).get()  # re-raises the worker's exception
                results[name] = res
                done(name, res)
        return {name: results[name] for name in names}


def run_planners(
    workload: Workload,
    policy: SloPolicy,
    names: list[str],
    config: AutoscaleSimConfig,
    requests: Requests,
    *,
    jobs: int = 1,
    progress: Progress | None = None,
    done: Done | None = None,
) -> dict[str, dict[str, Any]]:
    """`PlannerPool(...).run(names, ...)` in one call (no progress display to fork before)."""

    def no_progress(name: str, t: float) -> None:
        pass

    def not_told(name: str, result: dict[str, Any]) -> None:
        pass

    with PlannerPool(workload, policy, config, requests, min(jobs, len(names))) as pool:
        return pool.run(names, progress or no_progress, done or not_told)
