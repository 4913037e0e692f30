"""The coordinator's last routing decisions, for the status page (`dashboard.py`).

A bounded ring (`RECENT_ROUTES` = 50 entries, oldest dropped first): one row per routed
request, written once the request's legs are chosen (after a PD request's prefill returned,
so a fallback to local prefill shows as `local`). Rows carry no prompt text, only ids,
sizes and the chosen replicas, so the page can show them to whoever holds the admin token.
"""

from __future__ import annotations

from collections import deque
from typing import Any

RECENT_ROUTES = 50


class RecentRoutes:
    """`add` one row per routed request; `rows()` the newest last."""

    def __init__(self, size: int = RECENT_ROUTES) -> None:
        self._rows: deque[dict[str, Any]] = deque(maxlen=size)

    def add(
        self,
        at: float,
        request_id: str,
        route: str,
        prefill_replica: str | None,
        decode_replica: str,
        prompt_tokens: int,
    ) -> None:
        """`prefill_replica`: who prefilled (the decode replica itself on a local route: shown
        as None)."""
        if prefill_replica == decode_replica:
            prefill_replica = None
        self._rows.append(
            {
                "at": at,
                "request_id": request_id,
                "route": route,
                "prefill_replica": prefill_replica,
                "decode_replica": decode_replica,
                "prompt_tokens": prompt_tokens,
            }
        )

    def rows(self) -> list[dict[str, Any]]:
        return list(self._rows)
