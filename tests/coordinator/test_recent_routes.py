"""The coordinator's ring of recent routing decisions (`pdorch/app/recent_routes.py`)."""

from __future__ import annotations

import pytest

from pdorch.app.recent_routes import RecentRoutes

pytestmark = pytest.mark.unit


def test_the_ring_keeps_the_newest_and_a_local_route_names_no_prefill() -> None:
    ring = RecentRoutes(size=3)
    for i in range(5):
        ring.add(float(i), f"r{i}", "pd", "prefill-0", "decode-0", 100 + i)
    ring.add(9.0, "r-local", "local", "decode-1", "decode-1", 3)
    rows = ring.rows()
    assert [r["request_id"] for r in rows] == ["r3", "r4", "r-local"]  # oldest dropped first
    assert rows[1] == {
        "at": 4.0,
        "request_id": "r4",
        "route": "pd",
        "prefill_replica": "prefill-0",
        "decode_replica": "decode-0",
        "prompt_tokens": 104,
    }
    assert rows[2]["prefill_replica"] is None  # the decode replica prefilled it itself
    rows.clear()  # a copy: readers cannot change the ring
    assert len(ring.rows()) == 3
