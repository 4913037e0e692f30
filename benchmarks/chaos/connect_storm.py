"""The `connect-storm` scenario: many more connections at once than the coordinator's listen
backlog holds, each sending one request, while the steady load runs.

Fleet: the 2P+2D fleet of the other scenarios; the coordinator with `listen_backlog` =
`backlog` (128 by default; the coordinator's own default is 1024) and the admission of
`overload-mixed` (`max_concurrent_requests` 1.5 x `concurrency`, `admission.max_queue` =
`concurrency`, `max_wait_s` 2 s), so what reaches admission is served, queued or shed.

Timeline (seconds from the load's start): the steady load (`load.py`: `concurrency` clients,
half streaming, every request at `x-pdorch-priority: steady_priority` 10) from 0; at
`warmup_s` (at least `min_warmup_s`, 10 s) `connections` (1280: 10 x the backlog) bare asyncio
connects start at once, each sending one streamed completion (priority `storm_priority` 0,
`Connection: close`) as soon as it is connected; the steady load runs on until `settle_s`
after the storm's last answer; then stop and drain as `overload-mixed`.

What Linux does with it (`kernel` in the row: the host's sysctls and the deltas of its TCP
counters over the storm, box-wide): the listen queue holds `min(backlog, net.core.somaxconn)`
completed connections; while it is full a new SYN is dropped (`ListenOverflows`,
`ListenDrops`), and the client's kernel sends it again after 1 s, then 3 s, 7 s, 15 s, 31 s
(`net.ipv4.tcp_syn_retries` 6: ~127 s in all) - so a storm past the backlog is answered in
waves a second or more apart, however fast the coordinator accepts; SYN cookies
(`net.ipv4.tcp_syncookies`) only help a full *SYN* queue (`tcp_max_syn_backlog`), not a full
accept queue.

Figures per storm connection (`storm_figures`, pure): `attempted`; `connected` (the client's
connect returned) and `connect_s` p50/p99/max (from the storm's start); `refused`
(ECONNREFUSED), `connect_timeout` (not connected within `connect_timeout_s`), `reset`
(ECONNRESET / EPIPE at any point), `closed_without_answer` (EOF before a status line),
`answer_timeout` (connected, no whole answer within `request_timeout_s`); answered: `ok`
(200 and `[DONE]`), `shed` (429) by reason, `other_status` by status (a 503
`too_many_connections` among them); `last_answer_s` (storm start to its last answer or
give-up). The steady clients' streamed TTFT before / during / after (`steady_windows`:
during = the storm's start to its last answer) and in 5 s bins. Coordinator: `rss_mib`
(VmHWM at idle and at the end, and the largest VmRSS polled), `fds` (open fds polled: idle,
max, after), `listen_queue_max` (the largest accept-queue length polled, `/proc/net/tcp`
`rx_queue` of the listening socket), `listen_backlog_kernel` (the limit the kernel uses, `ss
-ltn` Send-Q: must equal `backlog`), the fd
limits of the bench client and the coordinator, and `pdorch_rejected_total` by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks.chaos.fleet import FleetSettings
from benchmarks.chaos.load import LoadSettings, payload
from benchmarks.chaos.overload import quantile, rss_peak_mib
from benchmarks.chaos.overload_mixed import (
    shed_reason,
    steady_bins,
    steady_figures,
    steady_windows,
)
from benchmarks.chaos.scenarios import load_is_zero, token_load_left
from benchmarks.chaos.steady_load import (
    Timeline,
    admission_fleet,
    admission_limit,
    no_fault_row,
    start_steady,
    stop_and_drain,
)
from pdorch.app.admission import PRIORITY_HEADER
from pools.http_client import http_client

NAME = "connect-storm"
SYSCTLS = (
    "net/core/somaxconn",
    "net/ipv4/tcp_max_syn_backlog",
    "net/ipv4/tcp_syncookies",
    "net/ipv4/tcp_abort_on_overflow",
    "net/ipv4/tcp_syn_retries",
    "net/ipv4/ip_local_port_range",
)
TCP_EXT = (
    "ListenOverflows",
    "ListenDrops",
    "SyncookiesSent",
    "SyncookiesRecv",
    "TCPReqQFullDrop",
    "TCPReqQFullDoCookies",
)


@dataclass(frozen=True, slots=True)
class StormSettings:
    connections: int = 1280
    backlog: int = 128
    connect_timeout_s: float = 60.0
    request_timeout_s: float = 120.0
    max_tokens: int = 16
    headroom: float = 0.5
    max_wait_s: float = 2.0
    steady_priority: int = 10
    storm_priority: int = 0
    retry_after_s: float = 1.0
    min_warmup_s: float = 10.0
    max_connections: int | None = None  # the coordinator's (None: its default, 4096)


@dataclass(slots=True)
class StormAnswer:
    """One storm connection (times in seconds from the storm's start)."""

    outcome: str = "answered"  # or refused, connect_timeout, reset, closed_without_answer, ...
    connect_s: float | None = None
    status: int | None = None
    done: bool = False  # a 200 stream that reached [DONE]
    end_s: float = 0.0
    body: bytes = b""  # a refusal's body (its reason)
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


async def storm_one(
    host: str,
    port: int,
    request: bytes,
    origin: float,
    connect_timeout_s: float,
    request_timeout_s: float,
) -> StormAnswer:
    """Connect, send `request` (a whole HTTP/1.1 request, `Connection: close`), read to EOF."""
    answer = StormAnswer()
    writer: asyncio.StreamWriter | None = None
    try:
        try:
            reader, opened = await asyncio.wait_for(
                asyncio.open_connection(host, port), connect_timeout_s
            )
        except TimeoutError:
            answer.outcome = "connect_timeout"
            return answer
        writer = opened
        answer.connect_s = time.perf_counter() - origin
        opened.write(request)
        received = b""
        async with asyncio.timeout(request_timeout_s):
            while chunk := await reader.read(65536):
                received = received + chunk if answer.status is None else (received + chunk)[-64:]
                if answer.status is None and b"\r\n\r\n" in received:
                    head, _, rest = received.partition(b"\r\n\r\n")
                    answer.status = int(head.split(b" ", 2)[1])
                    if answer.status != 200:
                        answer.body = rest + await reader.read()
                        break
                    received = rest[-64:]
        if answer.status is None:
            answer.outcome = "closed_without_answer"
        elif answer.status == 200:
            answer.done = b"[DONE]" in received
    except TimeoutError:
        answer.outcome = "answer_timeout"
    except ConnectionRefusedError:
        answer.outcome = "refused"
    except (ConnectionResetError, BrokenPipeError) as err:
        answer.outcome = "reset" if answer.status is None else "answered"
        answer.error = f"{type(err).__name__}"
    except OSError as err:
        answer.outcome = "os_error"
        answer.error = f"{type(err).__name__}: {err}"
    finally:
        answer.end_s = time.perf_counter() - origin
        if writer is not None:
            writer.close()
    return answer


def storm_figures(answers: Sequence[StormAnswer]) -> dict[str, Any]:
    """The storm's counts and times (module doc)."""
    outcomes: dict[str, int] = {}
    for a in answers:
        outcomes[a.outcome] = outcomes.get(a.outcome, 0) + 1
    answered = [a for a in answers if a.status is not None]
    shed: dict[str, int] = {}
    other: dict[str, int] = {}
    for a in answered:
        if a.status == 429:
            reason = shed_reason(a.body)
            shed[reason] = shed.get(reason, 0) + 1
        elif a.status != 200:
            code = _error_code(a.body)
            key = f"{a.status} {code}" if code else str(a.status)
            other[key] = other.get(key, 0) + 1
    connected = [a.connect_s for a in answers if a.connect_s is not None]
    return {
        "attempted": len(answers),
        "connected": len(connected),
        "connect_s": {
            "p50": quantile(connected, 0.5),
            "p99": quantile(connected, 0.99),
            "max": quantile(connected, 1.0),
        },
        "outcomes": outcomes,
        "answered": len(answered),
        "ok": sum(1 for a in answered if a.status == 200 and a.done),
        "ok_without_done": sum(1 for a in answered if a.status == 200 and not a.done),
        "shed": sum(shed.values()),
        "shed_reasons": shed,
        "other_status": other,
        "last_answer_s": quantile([a.end_s for a in answers], 1.0),
        "end_s": {
            "p50": quantile([a.end_s for a in answers], 0.5),
            "p99": quantile([a.end_s for a in answers], 0.99),
        },
    }


def _error_code(body: bytes) -> str | None:
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(code) if code is not None else None


def _sysctls() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in SYSCTLS:
        try:
            out[name.replace("/", ".")] = Path(f"/proc/sys/{name}").read_text().split("\n")[0]
        except OSError:
            out[name.replace("/", ".")] = None
    return out


def tcp_ext_counters(text: str) -> dict[str, int]:
    """The `TcpExt` counters of `TCP_EXT` from `/proc/net/netstat` text (pairs of lines:
    names, then values)."""
    lines = text.splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:") and values.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return {k: int(table[k]) for k in TCP_EXT if k in table}
    return {}


def _tcp_ext() -> dict[str, int]:
    try:
        return tcp_ext_counters(Path("/proc/net/netstat").read_text())
    except OSError:
        return {}


def listen_queue(text: str, port: int) -> int | None:
    """The accept queue now (completed connections not yet accepted) of the socket listening
    on `port`, from `/proc/net/tcp` text (state 0A: its `rx_queue`)."""
    want = f":{port:04X}"
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 4 and fields[3] == "0A" and fields[1].endswith(want):
            return int(fields[4].split(":")[1], 16)
    return None


def kernel_backlog(port: int) -> int | None:
    """The accept-queue limit the kernel uses for the socket listening on `port` (`ss -ltn`
    Send-Q: what `listen()` was last given, capped at somaxconn); None without `ss`."""
    try:
        out = subprocess.run(
            ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0] == "LISTEN":
            return int(fields[2])
    return None


def _fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _fd_limit(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return int(line.split()[3])
    except (OSError, ValueError, IndexError):
        return None
    return None


async def _poll_coordinator(pid: int, port: int, seen: dict[str, float], poll_s: float) -> None:
    """Largest fds, VmRSS and accept queue of the coordinator, every `poll_s` (off the loop's
    way: a few small /proc reads)."""
    while True:
        _sample(pid, port, seen)
        await asyncio.sleep(poll_s)


def _sample(pid: int, port: int, seen: dict[str, float]) -> None:
    fds, rss = _fds(pid), _rss_mib(pid)
    if fds is not None:
        seen["fds"] = max(seen.get("fds", 0), fds)
    if rss is not None:
        seen["rss"] = max(seen.get("rss", 0.0), rss)
    with contextlib.suppress(OSError):
        found = listen_queue(Path("/proc/net/tcp").read_text(), port)
        if found is not None:
            seen["queue"] = max(seen.get("queue", 0), found)


def _request(host: str, port: int, body: dict[str, Any], priority: int) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST /v1/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(data)}\r\n"
        f"{PRIORITY_HEADER}: {priority}\r\nconnection: close\r\n\r\n"
    ).encode() + data


def _raise_fd_limit() -> int:
    """The bench client's soft fd limit, raised to the hard one (the storm's sockets)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def run_connect_storm(
    fleet_settings: FleetSettings,
    load: LoadSettings,
    settings: StormSettings,
    log_dir: Path,
    timeline: Timeline,
) -> dict[str, Any]:
    """The scenario on a fresh fleet; its JSON row (module doc)."""
    client_fd_limit = _raise_fd_limit()
    limit = admission_limit(load, settings)
    edge = replace(
        fleet_settings, listen_backlog=settings.backlog, max_connections=settings.max_connections
    )
    fleet = admission_fleet(edge, load, settings, log_dir)
    load_before = os.getloadavg()
    try:
        await fleet.start()
        assert fleet.coordinator is not None
        pid = fleet.coordinator.pid
        rss_idle, fds_idle = rss_peak_mib(pid), _fds(pid)
        host, port = urlsplit(fleet.url).hostname or "127.0.0.1", urlsplit(fleet.url).port or 80
        backlog_used = kernel_backlog(port)
        model = fleet_settings.served_model_name
        storm_load = replace(load, max_tokens=settings.max_tokens)
        requests = [  # built before timing
            _request(host, port, payload(model, storm_load, stream=True), settings.storm_priority)
            for _ in range(settings.connections)
        ]
        async with http_client(timeout=10.0) as admin:
            seen: dict[str, float] = {}
            poller = asyncio.create_task(_poll_coordinator(pid, port, seen, timeline.poll_s))
            origin = time.perf_counter()
            steady = start_steady(fleet.url, model, load, settings, origin)
            await asyncio.sleep(max(timeline.warmup_s, settings.min_warmup_s))
            kernel_before = _tcp_ext()
            storm_at = time.perf_counter() - origin
            storm_origin = time.perf_counter()
            answers = await asyncio.gather(
                *(
                    storm_one(
                        host,
                        port,
                        request,
                        storm_origin,
                        settings.connect_timeout_s,
                        settings.request_timeout_s,
                    )
                    for request in requests
                )
            )
            kernel_after = _tcp_ext()
            storm_end = storm_at + max(a.end_s for a in answers)
            fds_max_storm = seen.get("fds")
            await asyncio.sleep(timeline.settle_s)
            results, view, rejected = await stop_and_drain(
                steady, admin, fleet.url, poller, timeline
            )
        rss_peak, fds_after = rss_peak_mib(pid), _fds(pid)
        coordinator_fd_limit = _fd_limit(pid)
    finally:
        fleet.close()
    steady_row = steady_figures(results)
    storm = storm_figures(answers)
    return {
        "scenario": NAME,
        "description": f"{settings.connections} connections at once, each one streamed request "
        f"(priority {settings.storm_priority}), against listen_backlog {settings.backlog} while "
        f"{load.concurrency} steady clients (priority {settings.steady_priority}) run; "
        f"max_concurrent_requests {limit}, queue {load.concurrency}, max_wait_s "
        f"{settings.max_wait_s:g}",
        **no_fault_row(),
        "sent": len(results) + len(answers),
        "succeeded": steady_row["ok"] + storm["ok"],
        "failed_before_first_byte": len(results) + len(answers) - steady_row["ok"] - storm["ok"],
        "storm": storm,
        "steady_class": steady_row,
        "steady": steady_windows(results, storm_at, storm_end),
        "steady_bins": steady_bins(results, storm_at),
        "storm_at_s": round(storm_at, 3),
        "storm_end_s": round(storm_end, 3),
        "settings": {
            "connections": settings.connections,
            "listen_backlog": settings.backlog,
            "max_connections": settings.max_connections,
            "connect_timeout_s": settings.connect_timeout_s,
            "request_timeout_s": settings.request_timeout_s,
            "max_tokens": settings.max_tokens,
            "head_shed_max_lag_s": fleet_settings.head_shed_max_lag_s,
            "head_shed_max_pending": fleet_settings.head_shed_max_pending,
        },
        "coordinator": {
            "rss_mib": {"idle_peak": rss_idle, "peak": rss_peak, "polled_max": seen.get("rss")},
            "fds": {
                "idle": fds_idle,
                "max_during_storm": fds_max_storm,
                "max": seen.get("fds"),
                "after": fds_after,
            },
            "listen_queue_max": seen.get("queue"),
            "listen_backlog_kernel": backlog_used,
            "fd_limit": coordinator_fd_limit,
            "rejected": rejected,
        },
        "bench_client_fd_limit": client_fd_limit,
        "kernel": {
            "sysctl": _sysctls(),
            "tcp_ext_delta": {k: kernel_after[k] - kernel_before.get(k, 0) for k in kernel_after},
        },
        "queue_after": {
            "queued": view.get("requests_queued"),
            "in_flight": view.get("requests_in_flight"),
        },
        "token_load_zero": load_is_zero(view),
        "token_load_after": token_load_left(view),
        "errors": steady_row["errors"][:3],
        "loadavg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }
