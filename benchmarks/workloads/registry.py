"""Workload names → generators, and `load_workload` (names or trace files)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from benchmarks.workloads import agentic, diurnal, rl_rollouts, shared_prefix
from benchmarks.workloads.model import Workload
from benchmarks.workloads.traces import load_trace

__all__ = ["WORKLOADS", "load_workload", "workload_names"]

Builder = Callable[..., Workload]

WORKLOADS: dict[str, Builder] = {
    rl_rollouts.NAME: rl_rollouts.build,
    agentic.NAME: agentic.build,
    shared_prefix.NAME: shared_prefix.build,
    diurnal.NAME: diurnal.build,
}


def workload_names() -> list[str]:
    return sorted(WORKLOADS)


def load_workload(
    name_or_trace: str | Path,
    *,
    trace_format: str | None = None,
    rate_scale: float = 1.0,
    seed: int = 0,
    **kw: Any,
) -> Workload:
    """A workload by registered name, or a trace file replayed (a path, or `trace_format` set).

    `rate_scale` compresses time: open-loop arrivals are divided by it (2.0 = twice the rate).
    `kw` are the workload's parameters (see each module) or the trace loader's options
    (`spread_buckets`, `max_requests`, `block_tokens`). Unknown names, unknown or invalid
    parameters raise `ValueError` naming them.
    """
    if rate_scale <= 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    key = str(name_or_trace)
    if trace_format is None and key in WORKLOADS:
        try:
            return WORKLOADS[key](seed=seed, rate_scale=rate_scale, **kw)
        except ValidationError as err:
            raise ValueError(f"workload {key!r}: {_describe(err)}") from None
    path = Path(key)
    if trace_format is not None or path.exists():
        return load_trace(path, trace_format=trace_format, rate_scale=rate_scale, seed=seed, **kw)
    raise ValueError(
        f"unknown workload {key!r}: not one of {', '.join(workload_names())} and not a file"
    )


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<params>"
        parts.append(f"parameter {loc!r}: {e['msg']}")
    return "; ".join(parts)
