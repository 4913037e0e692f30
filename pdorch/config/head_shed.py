"""`coordinator.head_shed` and `coordinator.listen_backlog` of the fleet file: shedding at the
request head when the coordinator's event loop lags (the rule: `pdorch/app/head_shed.py`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class HeadShedSettings(BaseModel):
    """429 at the request head, before its body is read, for requests below
    `protected_priority` while the loop lags or too many heads wait for their handler."""

    model_config = ConfigDict(extra="forbid")

    max_lag_s: float | None = Field(
        default=None,
        gt=0,
        description="While the coordinator's event loop runs more than this late (a probe "
        "every probe_interval_s; or a sample over it within hold_s), new requests below "
        "protected_priority get 429 loop_lag at their head. null: off.",
    )
    hold_s: float = Field(
        default=1.0,
        ge=0,
        le=60,
        description="How long one lag sample over max_lag_s keeps the gate shut (what the "
        "stall let in is still queued on the loop after it).",
    )
    probe_interval_s: float = Field(
        default=0.05,
        gt=0,
        le=10,
        description="How often the lag probe wakes (default 50 ms: 20 wakes a second).",
    )
    protected_priority: int = Field(
        default=1,
        ge=-100,
        le=101,
        description="Requests with x-pdorch-priority at or above this are never shed at the "
        "head (admission still applies); default 1: any positive priority. 101: none is.",
    )
    max_pending_requests: int | None = Field(
        default=1024,
        ge=1,
        description="Request heads let through whose handler has not started yet (the loop's "
        "own backlog); past it new requests below protected_priority get 429 pending. "
        "null: no limit.",
    )
