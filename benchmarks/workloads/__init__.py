"""Workloads for the fleet simulator and the live harness (see `API.md`)."""

from benchmarks.workloads.model import (
    Segment,
    SessionSpec,
    TurnSpec,
    Workload,
    content_id_for,
    output_content_id,
)
from benchmarks.workloads.registry import WORKLOADS, load_workload, workload_names
from benchmarks.workloads.traces import TraceFormatError

__all__ = [
    "WORKLOADS",
    "Segment",
    "SessionSpec",
    "TraceFormatError",
    "TurnSpec",
    "Workload",
    "content_id_for",
    "load_workload",
    "output_content_id",
    "workload_names",
]
