"""`connect-storm`'s figures (pure): the storm's outcome counts, the kernel's counters and the
listening socket's accept queue read from /proc text."""

from __future__ import annotations

from benchmarks.chaos.connect_storm import (
    StormAnswer,
    listen_queue,
    storm_figures,
    tcp_ext_counters,
)

NETSTAT = """\
TcpExt: SyncookiesSent SyncookiesRecv ListenOverflows ListenDrops TCPReqQFullDrop
TcpExt: 3 0 120 121 0
IpExt: InNoRoutes
IpExt: 0
"""
# a listener on 127.0.0.1:8000 (0x1F40) with 7 connections waiting, and an established one
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000007 00:00000000 00000000  1000
   1: 0100007F:1F40 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000
"""


def test_kernel_counters_and_the_accept_queue_are_read_from_proc_text() -> None:
    assert tcp_ext_counters(NETSTAT) == {
        "ListenOverflows": 120,
        "ListenDrops": 121,
        "SyncookiesSent": 3,
        "SyncookiesRecv": 0,
        "TCPReqQFullDrop": 0,
    }
    assert listen_queue(TCP, 8000) == 7
    assert listen_queue(TCP, 8001) is None


def test_storm_figures_count_each_connection_once_by_what_became_of_it() -> None:
    shed = b'{"error": {"message": "... max_concurrent_requests ...", "code": "x"}}'
    busy = b'{"error": {"message": "Too many", "code": "too_many_connections"}}'
    answers = [
        StormAnswer(connect_s=0.1, status=200, done=True, end_s=1.0),
        StormAnswer(connect_s=1.1, status=200, done=False, end_s=1.5),
        StormAnswer(connect_s=0.2, status=429, body=shed, end_s=0.3),
        StormAnswer(connect_s=0.2, status=503, body=busy, end_s=0.2),
        StormAnswer(outcome="refused", end_s=0.01),
        StormAnswer(outcome="connect_timeout", end_s=60.0),
        StormAnswer(outcome="reset", connect_s=0.5, end_s=0.6),
    ]
    figures = storm_figures(answers)
    assert figures["attempted"] == 7 and figures["connected"] == 5
    assert figures["outcomes"] == {
        "answered": 4,
        "refused": 1,
        "connect_timeout": 1,
        "reset": 1,
    }
    assert (figures["ok"], figures["ok_without_done"], figures["shed"]) == (1, 1, 1)
    assert figures["shed_reasons"] == {"concurrency": 1}
    assert figures["other_status"] == {"503 too_many_connections": 1}
    assert figures["last_answer_s"] == 60.0
    assert figures["connect_s"]["max"] == 1.1
