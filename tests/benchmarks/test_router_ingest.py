"""The ingestion measurement D2's `pdorch bench router` reports (no speed assertion here)."""

from __future__ import annotations

from benchmarks.router_ingest import measure_ingest_throughput


def test_ingest_measurement_runs_the_whole_path() -> None:
    m = measure_ingest_throughput(n_blocks=4000, block_size=16, blocks_per_event=8, replicas=4)
    assert m.blocks >= 4000
    assert m.events > 0 and m.messages > 0
    assert m.seconds > 0 and m.blocks_per_s > 0
