"""`pdorch bench chaos` on a CI-sized run: one scenario (kill -9 a decode engine), a few seconds
of load, real processes (four `pdorch engine sim`, `pdorch serve`); one JSON object on stdout
with the promised figures, and the behaviour the figures must show."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.chaos.scenarios import classify, gap_quantiles, largest_gap_s, routing_times
from benchmarks.live.client import RequestResult

PDORCH = Path(sys.executable).with_name("pdorch")


def test_kill_decode_on_a_short_run(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    cmd = [str(PDORCH), "bench", "chaos", "--json", "--scenarios", "kill-decode"]
    cmd += ["--concurrency", "6", "--max-tokens", "32", "--warmup-s", "2", "--down-s", "1"]
    cmd += ["--settle-s", "2", "--log-dir", str(tmp_path / "logs"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)  # exactly one JSON object, nothing else on stdout
    assert json.loads(out.read_text()) == result
    (row,) = result["rows"]
    assert row["scenario"] == "kill-decode"
    assert row["sent"] > 0 and row["succeeded"] > 0
    parts = ("succeeded", "failed_before_first_byte", "broken_mid_stream")
    assert sum(row[k] for k in parts) == row["sent"]
    # a request the dead engine had not started streaming is retried on the other replica
    assert row["failed_before_first_byte"] == 0, row["errors"]
    assert row["hung"] == 0, row["errors"]
    routing = row["routing"]["decode-0"]
    assert routing["out_s"] is not None and routing["out_s"] < 1.0, routing
    assert routing["back_s"] is not None, routing
    assert row["token_load_zero"], row["token_load_after"]
    assert set(row["token_load_after"]) == {"prefill-0", "prefill-1", "decode-0", "decode-1"}
    # the KV events reach the coordinator (the engines bind, it connects) and its index is
    # the engines' prefix caches once the load stops, the restarted engine's too
    kv = row["kv_index"]
    assert kv["match"], kv
    assert sum(r["engine"] for r in kv["replicas"].values()) > 0, kv


def test_kv_events_lost_then_replayed_on_a_short_run(tmp_path: Path) -> None:
    """decode-0's events are dropped at the relay for 3 s: the coordinator sees the gap at the
    next message, replays the lost batches from the engine, and ends with its index equal to
    every engine's prefix cache."""
    out = tmp_path / "chaos.json"
    cmd = [str(PDORCH), "bench", "chaos", "--json", "--scenarios", "kv-events-lost"]
    cmd += ["--concurrency", "6", "--max-tokens", "32", "--warmup-s", "2", "--stop-s", "3"]
    cmd += ["--settle-s", "2", "--log-dir", str(tmp_path / "logs"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout)["rows"]
    assert row["succeeded"] == row["sent"] > 0, row["errors"]
    assert row["kv_events_dropped"]["decode-0"] > 0
    counters = row["kv_event_counters"]
    assert counters["gaps"] >= 1 and counters["replays_completed"] >= 1, counters
    assert counters["missed"] == 0, counters
    assert row["kv_index"]["match"], row["kv_index"]


def _result(ttft: float | None, itl: list[float], end: float, error: str | None) -> RequestResult:
    r = RequestResult(session_id="s", turn=0, group="stream", start_s=1.0, end_s=1.0 + end)
    r.ttft_s, r.itl_s, r.error = ttft, itl, error
    return r


def test_outcomes_and_gaps() -> None:
    ok = _result(0.2, [0.1, 0.1], 0.45, None)
    broken = _result(0.2, [0.1], 0.4, "stream error: decode failed")
    early = _result(None, [], 0.3, "HTTP 502: every decode attempt failed")
    stalled = _result(0.2, [0.1, 6.0, 0.1], 6.5, None)  # SIGSTOP mid-stream, then SIGCONT
    silent_end = _result(0.2, [], 5.9, "timed out")  # no byte after the first for 5.7 s
    assert largest_gap_s(ok) < 0.3 and largest_gap_s(stalled) == 6.0
    assert abs(largest_gap_s(silent_end) - 5.7) < 1e-9
    assert classify([ok, broken, early, stalled, silent_end]) == {
        "sent": 5,
        "succeeded": 2,
        "failed_before_first_byte": 1,
        "broken_mid_stream": 2,
        "hung": 2,
    }
    gaps = gap_quantiles([ok, broken, early, stalled, silent_end])
    assert gaps["max"] == 6.0 and gaps["p99"] == 6.0 and gaps["p50"] is not None
    assert abs(gaps["p50"] - 0.3) < 1e-9  # nearest rank: the 3rd of 5 (early's 0.3 s)
    assert gap_quantiles([]) == {"p50": None, "p99": None, "max": None}


def test_routing_times_from_polls() -> None:
    polls = [
        (0.9, {"d0": "healthy"}),
        (1.1, {"d0": "healthy"}),
        (1.3, {"d0": "unhealthy"}),
        (4.2, {"d0": "unhealthy"}),
        (4.6, {"d0": "healthy"}),
    ]
    out_s, back_s = routing_times(polls, "d0", fault_at=1.0, recovered_at=4.0)
    assert out_s is not None and abs(out_s - 0.3) < 1e-9
    assert back_s is not None and abs(back_s - 0.6) < 1e-9
    assert routing_times(polls[:3], "d0", 1.0, 4.0) == (out_s, None)


def test_overload_sheds_with_retry_after_and_serves_the_admitted(tmp_path: Path) -> None:
    """A burst of 10 x 4 streamed requests against max_concurrent_requests 4 + a queue of 4."""
    cmd = [str(PDORCH), "bench", "chaos", "--json", "--scenarios", "overload"]
    cmd += ["--concurrency", "4", "--max-tokens", "64", "--log-dir", str(tmp_path / "logs")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout)["rows"]
    assert row["sent"] == 40 and row["succeeded"] + row["shed"] == 40, row
    assert row["other_errors"] == 0 and row["server_errors_5xx"] == 0, row["errors"]
    assert row["succeeded"] >= 8 and row["shed"] >= 16, row  # 4 running + 4 queued at least
    assert row["shed_with_retry_after"] == row["shed"]
    assert row["coordinator_rss_mib"]["peak"] > 0
    assert row["token_load_zero"] and row["requests_queued_after"] == 0


def test_overload_mixed_sheds_the_burst_not_the_steady_high_priority_clients(
    tmp_path: Path,
) -> None:
    """4 steady clients at priority 10; a burst of 40 streams (priorities 0 and -10) against
    max_concurrent_requests 6 + a queue of 4: every burst request is served or shed with 429 +
    Retry-After, what the clients saw shed is what the coordinator counts, no steady request is
    shed while a lower one could be, nothing is a 5xx, the queue and the token load are back
    to 0 after.

    Only what holds whatever the box's speed: how many of the burst are admitted depends on how
    many slots free while its 40 heads are read (a starved coordinator reads them over seconds,
    and streams end meanwhile), so no count of shed requests is asserted beyond "some"."""
    cmd = [str(PDORCH), "bench", "chaos", "--json", "--scenarios", "overload-mixed"]
    cmd += ["--concurrency", "4", "--max-tokens", "32", "--settle-s", "2"]
    cmd += ["--log-dir", str(tmp_path / "logs")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout)["rows"]
    classes = row["classes"]
    assert set(classes) == {"high", "normal", "low"}
    assert classes["normal"]["sent"] == classes["low"]["sent"] == 20
    high = classes["high"]
    assert high["sent"] > 0 and high["other_errors"] == 0, high
    # the top priority is never displaced (nothing ranks above it) nor refused at a full queue
    # (3 other steady clients cannot fill a queue of 4): it can only have waited max_wait_s
    # first in line, when no slot freed and no lower request could have been shed instead
    assert set(high["shed_reasons"]) <= {"queue_timeout"}, high
    admission_reasons = {"concurrency", "displaced", "queue_timeout"}
    for name in ("normal", "low"):
        c = classes[name]
        assert c["ok"] + c["shed"] == c["sent"] and c["admitted"] == c["ok"], c
        assert c["other_errors"] == 0 and c["server_errors_5xx"] == 0, c["errors"]
        assert c["shed_with_retry_after"] == c["shed"]
        assert set(c["shed_reasons"]) <= admission_reasons, c  # head shedding is off
    # a normal request is displaced only by a higher one: a steady client's
    assert classes["normal"]["shed_reasons"].get("displaced", 0) <= high["sent"]
    # 40 at once against 6 slots + 4 queued: the burst overflows
    assert classes["normal"]["shed"] + classes["low"]["shed"] > 0, classes
    # the clients' 429s, by reason, are exactly what the coordinator counts it shed
    seen: dict[str, int] = {}
    for c in classes.values():
        for reason, n in c["shed_reasons"].items():
            seen[reason] = seen.get(reason, 0) + n
    counted = {k: v for k, v in row["coordinator_rejected"].items() if v}
    assert counted == seen, (counted, seen)
    steady = row["steady"]
    # served once the burst began: "during" alone can be empty when the burst is all answered
    # (shed) within one steady stream's time, as on a starved coordinator
    assert steady["before"]["streams"] > 0, steady
    assert steady["during"]["streams"] + steady["after"]["streams"] > 0, steady
    queue = row["queue"]
    assert queue["max_in_flight"] <= 6 and queue["max_queued"] <= 4, queue
    assert queue["queued_after"] == 0 and queue["in_flight_after"] == 0, queue
    assert row["token_load_zero"], row["token_load_after"]
    assert row["coordinator_rss_mib"]["peak"] > 0
    # a displaced waiter is shed, never left holding a slot (its exception is retrieved)
    log = (tmp_path / "logs" / "overload-mixed" / "pdorch-serve.log").read_text()
    assert "never retrieved" not in log


def test_one_of_two_coordinators_killed_and_restarted_on_a_short_run(tmp_path: Path) -> None:
    """Two `pdorch serve` with peer sync over one fleet, clients split over both; coordinator
    1 killed with kill -9 after 2 s, restarted on the same ports 1 s later. The survivor's
    clients lose nothing; the killed one's lose only what was in flight or refused while it was
    down; once ready it serves, its index is rebuilt by replay (the engines' blocks, not only
    what they publish next) and its token load agrees with its peer's: 0 everywhere at the end."""
    cmd = [str(PDORCH), "bench", "chaos", "--json", "--scenarios", "kill-coordinator"]
    cmd += ["--concurrency", "6", "--max-tokens", "32", "--warmup-s", "2", "--down-s", "1"]
    cmd += ["--settle-s", "3", "--log-dir", str(tmp_path / "logs")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout)["rows"]
    assert row["scenario"] == "kill-coordinator" and row["synced_before_load"]
    survivor, killed = row["coordinators"]["0"], row["coordinators"]["1"]
    assert survivor["sent"] > 0 and survivor["succeeded"] == survivor["sent"], survivor["errors"]
    assert survivor["hung"] == 0 and row["survivor_polls_not_healthy"] == {}
    phases = killed["by_phase"]
    assert phases["after_ready"]["sent"] > 0, phases
    assert phases["after_ready"]["succeeded"] == phases["after_ready"]["sent"], phases
    assert phases["while_down"]["failed_before_first_byte"] > 0, phases  # refused: it was down
    assert killed["hung"] == 0
    restart = row["restart"]
    assert restart["first_success_s"] is not None and restart["kv_index_rebuilt_s"] is not None
    for c in (survivor, killed):
        assert c["token_load_zero"], c["token_load_after"]
        kv = c["kv_index_after"]
        assert kv["match"] and sum(r["engine"] for r in kv["replicas"].values()) > 0, kv
    assert killed["sync"]["peers"] and survivor["sync"]["peers_expired"] >= 0
    assert row["token_load"]["after_ready"]["converged_after_s"] is not None, row["token_load"]
    # every engine's join replay was measured: the restarted coordinator's /metrics
    replays = restart["replays"]["after_load"]
    assert set(replays) == set(killed["kv_index_after"]["replicas"]), replays
    for replica, replay in replays.items():
        assert replay["outcome"] == "completed" and replay["join"], (replica, replay)
        assert replay["seconds"] >= 0 and replay["blocks"] >= 0


def test_a_connect_storm_past_the_listen_backlog_is_answered_whole(tmp_path: Path) -> None:
    """200 connects at once against `listen_backlog` 16 while 4 steady clients run at
    priority 10: the kernel uses the configured backlog (the accept queue never holds more
    than backlog + 1; before the fix it was 2048 whatever the setting), every connection gets
    an HTTP answer (served or 429 with its admission reason, nothing else), the steady
    clients lose nothing, and everything is back to 0 after."""
    cmd = [str(PDORCH), "bench", "chaos", "--json", "--scenarios", "connect-storm"]
    cmd += ["--concurrency", "4", "--max-tokens", "16", "--settle-s", "1"]
    cmd += ["--storm-connections", "200", "--storm-backlog", "16"]
    cmd += ["--log-dir", str(tmp_path / "logs")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout)["rows"]
    storm, coordinator = row["storm"], row["coordinator"]
    assert storm["attempted"] == 200 and storm["outcomes"] == {"answered": 200}, storm
    assert storm["ok"] + storm["shed"] == 200 and storm["other_status"] == {}, storm
    assert set(storm["shed_reasons"]) <= {"concurrency", "displaced", "queue_timeout"}, storm
    if coordinator["listen_backlog_kernel"] is not None:  # None: no `ss` on this box
        assert coordinator["listen_backlog_kernel"] == 16
    assert coordinator["listen_queue_max"] is None or coordinator["listen_queue_max"] <= 17
    steady = row["steady_class"]
    assert steady["sent"] > 0 and steady["other_errors"] == 0, steady
    assert set(steady["shed_reasons"]) <= {"queue_timeout"}, steady
    assert coordinator["fds"]["max"] >= coordinator["fds"]["idle"] > 0
    assert row["queue_after"] == {"queued": 0, "in_flight": 0}
    assert row["token_load_zero"], row["token_load_after"]
    assert "net.core.somaxconn" in row["kernel"]["sysctl"]


def test_token_load_tolerance_and_phases() -> None:
    from benchmarks.chaos.convergence import (
        by_phase,
        convergence,
        index_rebuilt_after,
        within_tolerance,
    )

    a = {"d0": {"decode_blocks": 100, "requests_in_flight": 5}}
    assert within_tolerance(a, {"d0": {"decode_blocks": 110, "requests_in_flight": 3}})
    assert not within_tolerance(a, {"d0": {"decode_blocks": 120, "requests_in_flight": 5}})
    assert not within_tolerance(a, {})  # a coordinator that lost its peer's entries
    samples = [(0.5, a, {}), (1.2, a, {}), (1.4, a, a), (1.6, a, {})]
    conv = convergence(samples, 1.0, 2.0)
    assert conv["samples"] == 3 and conv["converged_after_s"] == 0.4
    assert conv["within_tolerance_share"] == 0.5
    assert conv["largest_difference"] == {"decode_blocks": 100, "requests_in_flight": 5}
    index = [(1.1, {"d0": 100}, {"d0": 3}), (1.3, {"d0": 120}, {"d0": 115})]
    assert index_rebuilt_after(index, 1.0) == 0.3
    assert index_rebuilt_after(index[:1], 1.0) is None
    before = _result(0.2, [], 0.5, "RemoteProtocolError")  # 1.0 -> 1.5, killed at 1.2
    done = _result(0.2, [], 0.1, None)  # ended before the kill: not in flight
    down = RequestResult(session_id="s", turn=1, group="whole", start_s=2.0, end_s=2.01)
    down.error = "ConnectError"
    after = RequestResult(session_id="s", turn=2, group="whole", start_s=5.0, end_s=5.5)
    after.ttft_s = 0.5
    phases = by_phase([before, done, down, after], killed_at=1.2, ready_at=4.0)
    assert phases["in_flight_at_kill"]["broken_mid_stream"] == 1
    assert phases["in_flight_at_kill"]["sent"] == 1
    assert phases["while_down"]["failed_before_first_byte"] == 1
    assert phases["after_ready"] == {**phases["after_ready"], "sent": 1, "succeeded": 1}
