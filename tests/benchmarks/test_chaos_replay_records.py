"""`kill-coordinator`'s replay figures: read from the coordinator's own `/metrics` text."""

from __future__ import annotations

from benchmarks.chaos.coordinator_restart import replay_records

METRICS = """\
# HELP pdorch_kv_replay_last_seconds Seconds the replica's last KV-event replay took.
# TYPE pdorch_kv_replay_last_seconds gauge
pdorch_kv_replay_last_seconds{join="true",outcome="completed",replica="decode-0"} 1.2345
pdorch_kv_replay_last_seconds{join="false",outcome="failed",replica="prefill-1"} 0.5
# TYPE pdorch_kv_replay_last_blocks gauge
pdorch_kv_replay_last_blocks{replica="decode-0"} 3000.0
pdorch_kv_replay_last_blocks{replica="prefill-1"} 0.0
pdorch_kv_replay_duration_seconds_count{outcome="completed"} 1.0
"""


def test_replay_records_reads_each_replicas_last_replay() -> None:
    assert replay_records(METRICS) == {
        "decode-0": {"seconds": 1.234, "outcome": "completed", "join": True, "blocks": 3000},
        "prefill-1": {"seconds": 0.5, "outcome": "failed", "join": False, "blocks": 0},
    }
    assert replay_records("pdorch_requests_in_flight 0\n") == {}
