"""Run one real vLLM engine as a child process: start, wait until healthy, stop.

vLLM starts several processes of its own (API server, engine core, workers). The engine is
therefore started in a new session (its own process group), and stopping it signals the whole
group: SIGTERM first so vLLM can release ports and shared memory, SIGKILL after a grace
period so a hung engine can never outlive its owner. Output goes to a log file, never to a pipe
(a pipe nobody reads fills up and blocks the engine); when the engine dies during start-up the
error carries the log's last lines, which is where vLLM says why.

Blocking methods suit sync code (tests, CLI); the `async` twins run them in a worker thread or
poll with `asyncio.sleep`, so an event loop (the coordinator, the autoscaler's actuator) is
never blocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from types import TracebackType

import httpx

from pools.http_client import http_client
from pools.vllm_spec import VllmEngineSpec

DEFAULT_START_TIMEOUT_S = 600.0
DEFAULT_STOP_GRACE_S = 20.0
LOG_TAIL_LINES = 40
_POLL_INTERVAL_S = 0.5


class VllmEngineError(RuntimeError):
    """The engine died or did not become healthy in time; the message holds its log tail."""


class VllmPortInUseError(VllmEngineError):
    """A port chosen for the engine was taken by another process before the engine bound it.

    Free ports are picked at run time from the ephemeral range, so any outgoing connection on
    the host may take one in the moment between the pick and the engine's bind. vLLM's NIXL
    handshake listener then dies in its thread while the server stays up and never turns
    healthy, so without this check the wait ran to its whole timeout (540 s in the test
    fixture). The caller may retry on fresh ports.
    """


_BIND_FAILURE = "Address already in use"


class RunningVllm:
    """One vLLM engine process started from a `VllmEngineSpec`.

    Attributes used by tests and pools: `url`, `served_model_name`, `kv_events_endpoint`,
    `kv_events_replay_endpoint`, `side_channel_port`, `block_size`, `num_gpu_blocks`,
    `log_path`. Use as a context manager, or call `start()`/`wait_healthy()`/`stop()`.
    """

    def __init__(self, spec: VllmEngineSpec, log_path: Path, python: str | None = None) -> None:
        self.spec = spec
        self.log_path = log_path
        self.python = python or sys.executable
        self._process: subprocess.Popen[bytes] | None = None
        self._num_gpu_blocks: int | None = spec.num_gpu_blocks_override

    # -- what callers need to talk to the engine -------------------------------------------
    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def served_model_name(self) -> str:
        return self.spec.name

    @property
    def kv_events_endpoint(self) -> str | None:
        return self.spec.kv_events_endpoint

    @property
    def kv_events_replay_endpoint(self) -> str | None:
        return self.spec.kv_events_replay_endpoint

    @property
    def side_channel_port(self) -> int:
        return self.spec.side_channel_port

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    @property
    def num_gpu_blocks(self) -> int | None:
        """KV blocks in the engine's pool, as the engine reports it once healthy.

        Before that: the spec's override (None when vLLM sizes the pool itself).
        """
        return self._num_gpu_blocks

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def returncode(self) -> int | None:
        """Exit status once the process has ended, else None."""
        return None if self._process is None else self._process.poll()

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn the engine (returns at once; use `wait_healthy` to wait for it)."""
        if self._process is not None:
            raise RuntimeError("engine already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = self.spec.argv(self.python)
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                argv,
                env=self.spec.env(os.environ, host_cores=len(os.sched_getaffinity(0))),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last `lines` lines of the engine log ("" if it has none yet)."""
        try:
            with self.log_path.open("r", encoding="utf-8", errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except FileNotFoundError:
            return ""

    def _failure(self, what: str) -> VllmEngineError:
        return VllmEngineError(
            f"vLLM {self.spec.role} engine at {self.url} {what} (log: {self.log_path}); "
            f"last {LOG_TAIL_LINES} log lines:\n{self.log_tail()}"
        )

    def check_alive(self) -> None:
        """Raise `VllmEngineError` with the log tail if the engine process has exited."""
        if self._process is None:
            raise RuntimeError("engine not started")
        code = self._process.poll()
        if code is not None:
            raise self._failure(f"exited with status {code}")

    def check_bound(self) -> None:
        """Raise `VllmPortInUseError` if the engine log reports a port it could not bind."""
        tail = self.log_tail()
        if _BIND_FAILURE in tail:
            raise VllmPortInUseError(
                f"vLLM {self.spec.role} engine at {self.url} could not bind a port: another "
                f"process took it (log: {self.log_path}); last {LOG_TAIL_LINES} log lines:\n{tail}"
            )

    def is_healthy(self, client: httpx.Client | None = None) -> bool:
        """One `/health` probe: True on HTTP 200, False on any error or other status."""
        try:
            if client is None:
                return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200
            return client.get(f"{self.url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        """Block until `/health` answers 200; on crash or timeout raise with the log tail.

        The process is not stopped on failure: the caller owns it and calls `stop()`.
        """
        deadline = time.monotonic() + timeout_s
        with httpx.Client() as client:
            while True:
                self.check_alive()
                self.check_bound()
                if self.is_healthy(client):
                    self._read_cache_config(client.get(f"{self.url}/metrics", timeout=10.0))
                    return
                if time.monotonic() >= deadline:
                    raise self._failure(f"not healthy within {timeout_s:.0f}s")
                time.sleep(_POLL_INTERVAL_S)

    async def wait_healthy_async(self, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        """`wait_healthy` for asyncio code: polls without blocking the loop."""
        deadline = time.monotonic() + timeout_s
        async with http_client() as client:
            while True:
                self.check_alive()
                self.check_bound()
                with contextlib.suppress(httpx.HTTPError):
                    response = await client.get(f"{self.url}/health", timeout=2.0)
                    if response.status_code == 200:
                        metrics = await client.get(f"{self.url}/metrics", timeout=10.0)
                        self._read_cache_config(metrics)
                        return
                if time.monotonic() >= deadline:
                    raise self._failure(f"not healthy within {timeout_s:.0f}s")
                await asyncio.sleep(_POLL_INTERVAL_S)

    def _read_cache_config(self, metrics: httpx.Response) -> None:
        """Take the KV pool size from `vllm:cache_config_info` (vLLM sizes it at start-up)."""
        if metrics.status_code == 200:
            blocks = num_gpu_blocks_from_metrics(metrics.text)
            if blocks is not None:
                self._num_gpu_blocks = blocks

    def stop(self, grace: float = DEFAULT_STOP_GRACE_S) -> int | None:
        """Stop the whole process group: SIGTERM, then SIGKILL after `grace` seconds.

        Idempotent; returns the exit status (None if never started).
        """
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
        # vLLM's helpers may outlive the leader after SIGTERM; the group must go with it.
        _signal_group(process.pid, signal.SIGKILL)
        return process.returncode

    async def stop_async(self, grace: float = DEFAULT_STOP_GRACE_S) -> int | None:
        """`stop` for asyncio code (the waiting runs in a worker thread)."""
        return await asyncio.to_thread(self.stop, grace)

    def __enter__(self) -> RunningVllm:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def num_gpu_blocks_from_metrics(text: str) -> int | None:
    """`num_gpu_blocks` label of `vllm:cache_config_info` in a `/metrics` page, if present."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            for sample in family.samples:
                value = sample.labels.get("num_gpu_blocks", "")
                if value.isdigit():
                    return int(value)
    return None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a process group that may already be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
