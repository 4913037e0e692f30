"""A block owner in a separate process (`python -m transfer.peer`), driven from a test."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from tests.waiting import wait_until
from transfer import KvTransport, PeerAddress, UcxTransport
from transfer.peer import command as peer_command

REPO = Path(__file__).resolve().parents[2]


class OwnerProcess:
    """Starts the peer, collects its JSON events, sends it commands."""

    def __init__(
        self,
        kind: KvTransport,
        num_blocks: int,
        block_bytes: int,
        seed: int,
        transport: UcxTransport = UcxTransport.AUTO,
        ready_timeout: float = 60.0,
        wait: bool = True,
    ) -> None:
        self.kind = kind
        self.seed = seed
        self.block_bytes = block_bytes
        self.events: list[dict[str, Any]] = []
        self.stderr_lines: list[str] = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            peer_command(kind, transport, num_blocks, block_bytes, seed),
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self._ready_timeout = ready_timeout
        if wait:
            self.wait_ready()

    def wait_ready(self) -> OwnerProcess:
        ready = self.wait_event(lambda e: e["event"] == "ready", self._ready_timeout, "ready")
        self.address = PeerAddress(**ready["address"])
        return self

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                with self._lock:
                    self.events.append(json.loads(line))

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    def wait_event(self, match: Any, timeout: float, message: str) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            if self.proc.poll() is not None and not self.events:
                raise RuntimeError(f"owner exited: {''.join(self.stderr_lines[-20:])}")
            with self._lock:
                for event in self.events:
                    if match(event):
                        return event
            return None

        return wait_until(find, timeout, message=message)

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def hold(self, request_id: str, block_ids: list[int], lease_s: float = 30.0) -> None:
        with self._lock:
            start = len(self.events)
        self.send(
            {"cmd": "hold", "request_id": request_id, "block_ids": block_ids, "lease_s": lease_s}
        )

        def answer() -> dict[str, Any] | None:
            with self._lock:
                for event in self.events[start:]:
                    if event["event"] == "error" or event.get("request_id") == request_id:
                        return event
            return None

        event = wait_until(answer, 10, message=f"hold {request_id}")
        assert event["event"] == "held", event

    def released(self, request_id: str, timeout: float = 10.0) -> dict[str, Any]:
        return self.wait_event(
            lambda e: e["event"] == "released" and e["request_id"] == request_id,
            timeout,
            f"{request_id} released",
        )

    def has_released(self, request_id: str) -> bool:
        with self._lock:
            return any(
                e["event"] == "released" and e["request_id"] == request_id for e in self.events
            )

    def stats(self) -> dict[str, Any]:
        with self._lock:
            seen = sum(1 for e in self.events if e["event"] == "stats")
        self.send({"cmd": "stats"})

        def nth() -> dict[str, Any] | None:
            with self._lock:
                found = [e for e in self.events if e["event"] == "stats"]
            return found[seen] if len(found) > seen else None

        return wait_until(nth, 10, message="owner stats")

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def close(self) -> None:
        """Quit politely if it runs, else kill; always reaped. Safe to call twice."""
        if self.proc.poll() is None:
            try:
                self.signal(signal.SIGCONT)
                self.send({"cmd": "quit"})
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.proc.kill()
                self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
