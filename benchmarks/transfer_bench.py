"""The transfer benchmark behind `pdorch bench transfer`: is this fabric good enough for P/D?

Side by side, on the same machine and in one run, for block sizes 16 KiB, 256 KiB and 2 MiB,
contiguous and scattered block ids:

* `memcpy`     — in-process copy between two pools (the ceiling; runs of adjacent ids merged);
* `tcp_socket` — a plain TCP socket from another process (`sendall`/`recv_into`, runs merged);
* `nixl_shm`   — `NixlBlockMover`, transport auto (UCX error handling none: shared memory);
* `nixl_tcp`   — `NixlBlockMover`, transport tcp (UCX default error handling, `UCX_TLS=tcp`);
* `tcp_mover`  — `TcpBlockMover` (the fallback).

Every method moves `total` bytes per repetition from an owner process to a puller process
(memcpy: one process), and every received block is checked against its xxh3 digest. Each
(method, block size) runs in a fresh worker process (so one case's memory, threads and UCX
state cannot disturb the next), which starts its owner as `python -m transfer.peer`. The
puller's pool and the owner's pool have 2x the blocks moved, so scattered ids are a random
sample of both. Reported GB/s is the median over repetitions (`gbps_best` is the best one); a
pull's time includes the lease check and the notification, as a decode engine would see it.
`ratio_to_memcpy` = a method's median / memcpy's *best* for the same block size and pattern:
the ceiling is the fastest copy this machine managed, which keeps the ratio honest when other
work shares the cores.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import multiprocessing.connection
import os
import platform
import queue
import socket
import statistics
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from transfer.pattern import block_digest, expected_digest, fill_pool
from transfer.peer import command as peer_command
from transfer.pool import KvBlockPool

METHODS = ("memcpy", "tcp_socket", "nixl_shm", "nixl_tcp", "tcp_mover")
BLOCK_SIZES = (16 << 10, 256 << 10, 2 << 20)
PATTERNS = ("contiguous", "scattered")
SEED = 20261129
MIN_REPS = 3
MAX_REPS = 10
MIN_TIMED_S = 0.3

TARGETS = (
    {
        "name": "nixl_shm >= 0.5x memcpy at 2 MiB blocks",
        "method": "nixl_shm",
        "block_bytes": 2 << 20,
        "metric": "ratio_to_memcpy",
        "min": 0.5,
    },
    {
        "name": "nixl_shm scattered 16 KiB blocks >= 2 GB/s",
        "method": "nixl_shm",
        "block_bytes": 16 << 10,
        "pattern": "scattered",
        "metric": "gbps",
        "min": 2.0,
    },
)


@dataclass(frozen=True)
class CaseSpec:
    method: str
    block_bytes: int
    total_bytes: int
    seed: int = SEED

    @property
    def blocks(self) -> int:
        return max(1, self.total_bytes // self.block_bytes)


def block_ids(spec: CaseSpec, pattern: str, side: int) -> list[int]:
    """The ids moved: 0..n-1, or a random sample of n out of the pool's 2n (per side)."""
    n = spec.blocks
    if pattern == "contiguous":
        return list(range(n))
    rng = np.random.default_rng([spec.seed, spec.block_bytes, side])
    return [int(i) for i in rng.choice(2 * n, size=n, replace=False)]


def runs(ids: list[int], other: list[int] | None = None) -> Iterator[tuple[int, int, int]]:
    """(start in ids, start in other, length) of runs adjacent in both lists."""
    other = ids if other is None else other
    i = 0
    while i < len(ids):
        j = i + 1
        while j < len(ids) and ids[j] == ids[j - 1] + 1 and other[j] == other[j - 1] + 1:
            j += 1
        yield ids[i], other[i], j - i
        i = j


class _Verifier:
    def __init__(self, seed: int, block_bytes: int) -> None:
        self.seed = seed
        self.block_bytes = block_bytes
        self._digests: dict[int, int] = {}

    def check(self, pool: KvBlockPool, remote: list[int], local: list[int]) -> bool:
        array = pool.blocks_array()
        for r, loc in zip(remote, local, strict=True):
            want = self._digests.get(r)
            if want is None:
                want = self._digests[r] = expected_digest(self.seed, r, self.block_bytes)
            if block_digest(array[loc]) != want:
                return False
        return True


def _clear(pool: KvBlockPool, ids: list[int]) -> None:
    array = pool.blocks_array()
    for start, _, length in runs(ids):
        array[start : start + length] = 0


class _Reps:
    """Repetitions of one (method, block size, pattern) until enough were timed."""

    def __init__(self, spec: CaseSpec, pattern: str) -> None:
        self.spec = spec
        self.pattern = pattern
        self.remote = block_ids(spec, pattern, 0)
        self.local = block_ids(spec, pattern, 1)
        self.nbytes = len(self.remote) * spec.block_bytes
        self.rates: list[float] = []
        self.verified = True
        self.timed = 0.0

    def more(self) -> bool:
        n = len(self.rates)
        return n < MAX_REPS and (n < MIN_REPS or self.timed < MIN_TIMED_S)

    def add(self, seconds: float, verified: bool) -> None:
        self.timed += seconds
        self.rates.append(self.nbytes / seconds / 1e9)
        self.verified = self.verified and verified

    def row(self) -> dict[str, Any]:
        return {
            "method": self.spec.method,
            "block_bytes": self.spec.block_bytes,
            "pattern": self.pattern,
            "gbps": round(statistics.median(self.rates), 3),
            "gbps_best": round(max(self.rates), 3),
            "reps": len(self.rates),
            "blocks": len(self.remote),
            "bytes": self.nbytes,
            "verified": self.verified,
        }


def _measure(
    spec: CaseSpec,
    pattern: str,
    verifier: _Verifier,
    pool: KvBlockPool,
    one_rep: Callable[[list[int], list[int]], float],
) -> dict[str, Any]:
    reps = _Reps(spec, pattern)
    while reps.more():
        _clear(pool, reps.local)
        seconds = one_rep(reps.remote, reps.local)
        reps.add(seconds, verifier.check(pool, reps.remote, reps.local))
    return reps.row()


# --- memcpy -------------------------------------------------------------------------------
def _case_memcpy(spec: CaseSpec, emit: Callable[[dict[str, Any]], None]) -> None:
    src = KvBlockPool(2 * spec.blocks, spec.block_bytes)
    fill_pool(src, spec.seed)
    dst = KvBlockPool(2 * spec.blocks, spec.block_bytes)
    verifier = _Verifier(spec.seed, spec.block_bytes)
    a, b = src.blocks_array(), dst.blocks_array()

    def rep(remote: list[int], local: list[int]) -> float:
        started = time.perf_counter()
        for r, loc, length in runs(remote, local):
            np.copyto(b[loc : loc + length], a[r : r + length])
        return time.perf_counter() - started

    for pattern in PATTERNS:
        emit(_measure(spec, pattern, verifier, dst, rep))


# --- plain TCP socket ---------------------------------------------------------------------
def _socket_server(conn: multiprocessing.connection.Connection, spec: CaseSpec) -> None:
    pool = KvBlockPool(2 * spec.blocks, spec.block_bytes)
    fill_pool(pool, spec.seed)
    array = pool.blocks_array()
    with socket.create_server(("127.0.0.1", 0)) as server:
        conn.send(server.getsockname()[1])
        client, _ = server.accept()
        with client:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                count = struct.unpack("!I", _recv_exact(client, 4))[0]
                if count == 0:
                    return
                ids = np.frombuffer(_recv_exact(client, 4 * count), dtype=">u4").tolist()
                for start, _, length in runs(ids):
                    client.sendall(array[start : start + length].data.cast("B"))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray(n)
    _recv_into(sock, memoryview(data))
    return bytes(data)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("socket closed")
        got += k


def _case_tcp_socket(spec: CaseSpec, emit: Callable[[dict[str, Any]], None]) -> None:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_socket_server, args=(child, spec), daemon=True)
    server.start()
    try:
        port = parent.recv()
        pool = KvBlockPool(2 * spec.blocks, spec.block_bytes)
        array = pool.blocks_array()
        verifier = _Verifier(spec.seed, spec.block_bytes)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def rep(remote: list[int], local: list[int]) -> float:
                header = struct.pack("!I", len(remote)) + np.asarray(remote, ">u4").tobytes()
                started = time.perf_counter()
                sock.sendall(header)
                for start, _, length in runs(local):
                    _recv_into(sock, array[start : start + length].data.cast("B"))
                return time.perf_counter() - started

            for pattern in PATTERNS:
                emit(_measure(spec, pattern, verifier, pool, rep))
            sock.sendall(struct.pack("!I", 0))
    finally:
        server.join(timeout=10)
        if server.is_alive():
            server.kill()


# --- the movers ---------------------------------------------------------------------------
class _OwnerPeer:
    """`python -m transfer.peer` with its JSON-lines events in a queue."""

    def __init__(self, spec: CaseSpec, kind: str, transport: str) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.proc = subprocess.Popen(
            peer_command(kind, transport, 2 * spec.blocks, spec.block_bytes, spec.seed),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = self.wait("ready")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))

    def wait(self, event: str, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"owner sent no {event!r}") from None
            if got["event"] == event:
                return got
            if got["event"] == "error":
                raise RuntimeError(got["message"])

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def hold(self, request_id: str, ids: list[int]) -> None:
        self.send({"cmd": "hold", "request_id": request_id, "block_ids": ids, "lease_s": 120})
        self.wait("held")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"cmd": "quit"})
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def _case_mover(spec: CaseSpec, emit: Callable[[dict[str, Any]], None]) -> None:
    from transfer.factory import make_block_mover
    from transfer.nixl_mover import NixlSettings
    from transfer.params import PeerAddress
    from transfer.transports import KvTransport, UcxTransport

    kind, transport = {
        "nixl_shm": (KvTransport.NIXL, UcxTransport.AUTO),
        "nixl_tcp": (KvTransport.NIXL, UcxTransport.TCP),
        "tcp_mover": (KvTransport.TCP, UcxTransport.AUTO),
    }[spec.method]
    owner = _OwnerPeer(spec, kind, transport)
    try:
        peer = PeerAddress(**owner.ready["address"])
        pool = KvBlockPool(2 * spec.blocks, spec.block_bytes)
        verifier = _Verifier(spec.seed, spec.block_bytes)

        async def main() -> None:
            mover = make_block_mover(
                pool,
                kind,
                settings=NixlSettings(transport=transport),
            )
            async with mover:
                owner.hold("warmup", [0])
                await mover.pull(peer, [0], [0], "warmup", time.monotonic() + 60)
                for pattern in PATTERNS:
                    reps = _Reps(spec, pattern)
                    while reps.more():
                        _clear(pool, reps.local)
                        request_id = f"{pattern}-{len(reps.rates)}"
                        # The owner answers on its own; nothing is in flight on this loop.
                        owner.hold(request_id, reps.remote)
                        result = await mover.pull(
                            peer, reps.remote, reps.local, request_id, time.monotonic() + 120
                        )
                        ok = verifier.check(pool, reps.remote, reps.local)
                        reps.add(result.seconds, ok)
                    emit(reps.row())

        asyncio.run(main())
    finally:
        owner.close()


def run_case(conn: multiprocessing.connection.Connection, spec: CaseSpec) -> None:
    """Worker process entry: run one (method, block size) and send its rows, then None."""
    try:
        case = {"memcpy": _case_memcpy, "tcp_socket": _case_tcp_socket}.get(
            spec.method, _case_mover
        )
        case(spec, conn.send)
    except Exception as exc:
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
    conn.send(None)


def run_bench(
    total_mib: int,
    methods: tuple[str, ...] = METHODS,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    block_sizes: tuple[int, ...] = BLOCK_SIZES,
) -> dict[str, Any]:
    """Run every case, one worker process at a time; returns the report (rows + targets)."""
    ctx = multiprocessing.get_context("spawn")
    rows: list[dict[str, Any]] = []
    started = time.time()
    load_at_start = os.getloadavg()
    for method in methods:
        for block_bytes in block_sizes:
            spec = CaseSpec(method, block_bytes, total_mib << 20)
            parent, child = ctx.Pipe()
            worker = ctx.Process(target=run_case, args=(child, spec))
            worker.start()
            child.close()
            got = 0
            try:
                while (row := parent.recv()) is not None:
                    if "error" in row:
                        break
                    rows.append(row)
                    got += 1
                    if on_row is not None:
                        on_row(row)
            except EOFError:
                row = {"error": f"worker exited with {worker.exitcode}"}
            worker.join()
            for pattern in PATTERNS[got:]:
                failed = {
                    "method": method,
                    "block_bytes": block_bytes,
                    "pattern": pattern,
                    "gbps": 0.0,
                    "verified": False,
                    "error": (row or {}).get("error", "no result"),
                }
                rows.append(failed)
                if on_row is not None:
                    on_row(failed)
    _add_ratios(rows)
    return {
        "rows": rows,
        "targets": evaluate_targets(rows),
        "total_mib": total_mib,
        "machine": {**machine_info(), "loadavg_at_start": load_at_start},
        "seconds": round(time.time() - started, 1),
    }


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    base = {
        (r["block_bytes"], r["pattern"]): r.get("gbps_best", r["gbps"])
        for r in rows
        if r["method"] == "memcpy"
    }
    for row in rows:
        ref = base.get((row["block_bytes"], row["pattern"]))
        row["ratio_to_memcpy"] = round(row["gbps"] / ref, 3) if ref else None


def evaluate_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for target in TARGETS:
        matching = [
            r
            for r in rows
            if r["method"] == target["method"]
            and r["block_bytes"] == target["block_bytes"]
            and ("pattern" not in target or r["pattern"] == target["pattern"])
        ]
        values = [r.get(str(target["metric"])) for r in matching]
        met = bool(values) and all(
            v is not None and v >= target["min"] and r["verified"]
            for v, r in zip(values, matching, strict=True)
        )
        out.append({"name": target["name"], "values": values, "met": met if values else None})
    return out


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        info["loadavg_at_end"] = os.getloadavg()
    except OSError:
        pass
    try:
        from importlib.metadata import version

        info["nixl"] = version("nixl")
    except Exception:
        info["nixl"] = None
    return info
