"""What the soak reads of the coordinator's OS process, from /proc (Linux only).

- `rss_mib`: `VmRSS` of /proc/PID/status (resident set now, MiB; not the high-water mark).
- `open_fds`: entries of /proc/PID/fd.
- `sockets`: those fds that are sockets (`socket:[inode]`).
- connections by peer: the process's socket inodes looked up in /proc/PID/net/tcp and tcp6
  (the process's network namespace), ESTABLISHED only, grouped by what the remote port is:
  an engine's HTTP port (`upstream_http`: the legs' pooled connections, health probes,
  metrics scrapes), an engine's KV-event or replay port (`upstream_zmq`: the ZMQ SUB/DEALER
  sockets), the coordinator's own listening port (`clients`: inbound connections).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

ESTABLISHED = "01"  # the `st` column of /proc/net/tcp


@dataclass(frozen=True, slots=True)
class ProcessSample:
    rss_mib: float
    open_fds: int
    sockets: int
    upstream_http: int
    upstream_zmq: int
    clients: int


def socket_inodes(pid: int) -> tuple[int, set[str]]:
    """(open fd count, inodes of the fds that are sockets)."""
    fd_dir = Path(f"/proc/{pid}/fd")
    count = 0
    inodes: set[str] = set()
    for entry in os.scandir(fd_dir):
        count += 1
        try:
            target = os.readlink(entry.path)
        except OSError:  # closed between the listing and the readlink
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return count, inodes


def established_peers(pid: int, inodes: Collection[str]) -> list[tuple[int, int]]:
    """(local port, remote port) of each ESTABLISHED TCP socket among `inodes`."""
    peers: list[tuple[int, int]] = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != ESTABLISHED or cols[9] not in inodes:
                continue
            local = int(cols[1].rsplit(":", 1)[1], 16)
            remote = int(cols[2].rsplit(":", 1)[1], 16)
            peers.append((local, remote))
    return peers


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise OSError(f"no VmRSS for pid {pid}")


def sample_process(
    pid: int, http_ports: Collection[int], zmq_ports: Collection[int], own_port: int
) -> ProcessSample:
    """One reading of the process (raises OSError when it is gone)."""
    fds, inodes = socket_inodes(pid)
    peers = established_peers(pid, inodes)
    return ProcessSample(
        rss_mib=round(rss_mib(pid), 2),
        open_fds=fds,
        sockets=len(inodes),
        upstream_http=sum(1 for _, remote in peers if remote in http_ports),
        upstream_zmq=sum(1 for _, remote in peers if remote in zmq_ports),
        clients=sum(1 for local, _ in peers if local == own_port),
    )
