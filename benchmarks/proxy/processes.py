"""The processes a proxy benchmark runs: two simulated engines and the proxies under test.

Each is a separate OS process (as in production), started with a free port, waited on by
polling its HTTP endpoint (or the sim's `ready <url>` line), logged to a file, and stopped
(SIGTERM, then SIGKILL) whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from pools.http_client import http_client
from pools.ports import free_ports


class ProcessStartError(RuntimeError):
    """A process did not become ready; the message carries the tail of its log.
    `port_taken`: its log says its port was taken (another process bound it first)."""

    port_taken = False


@dataclass
class RunningProcess:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid


def venv_bin(name: str) -> str:
    """A console script next to this interpreter (the venv's), else from PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed (looked next to {sys.executable})")
    return found


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop_process(proc: RunningProcess, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; never raises (callers stop several in a row)."""
    if proc.process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.process.send_signal(signal.SIGTERM)
    try:
        proc.process.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.process.wait(30.0)


async def _wait_http(proc: RunningProcess, path: str, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    async with http_client(timeout=1.0) as client:
        while True:
            if proc.process.poll() is not None:
                raise ProcessStartError(
                    f"{proc.name} exited with {proc.process.returncode}:\n"
                    + _log_tail(proc.log_path)
                )
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(proc.url + path)).status_code == 200:
                    return
            if time.monotonic() > deadline:
                stop_process(proc)
                raise ProcessStartError(
                    f"{proc.name} not ready after {wait_s:.0f}s:\n{_log_tail(proc.log_path)}"
                )
            await asyncio.sleep(0.1)


async def start_sim(
    role: str,
    log_dir: Path,
    *,
    time_scale: float,
    model_profile: str,
    served_model_name: str,
    kv_events_port: int,
    start_timeout_s: float = 60.0,
) -> RunningProcess:
    """`pdorch engine sim` in its own process; returns once it printed `ready <url>`."""
    log_path = log_dir / f"sim-{role}.log"
    cmd = [
        venv_bin("pdorch"),
        "engine",
        "sim",
        "--role",
        role,
        "--port",
        "0",
        "--time-scale",
        str(time_scale),
        "--model-profile",
        model_profile,
        "--served-model-name",
        served_model_name,
        "--kv-transport",
        "tcp",
        # The proxy's prompts are short; a small pool starts in a second, where the profile's
        # default (e.g. `tiny` on an H100: ~2.3M blocks) takes most of a minute to allocate.
        "--num-blocks",
        "8192",
        "--kv-events-endpoint",
        f"tcp://127.0.0.1:{kv_events_port}",
        "--kv-events-topic",
        role,
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: ASYNC220  (start-up only, not the timed path)
            cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL
        )
    assert process.stdout is not None
    proc = RunningProcess(f"sim {role}", "", process, log_path)
    loop = asyncio.get_running_loop()
    try:
        line = await asyncio.wait_for(
            loop.run_in_executor(None, process.stdout.readline), start_timeout_s
        )
    except TimeoutError:
        stop_process(proc)
        raise ProcessStartError(f"sim {role}: no ready line:\n{_log_tail(log_path)}") from None
    if not line.startswith(b"ready "):
        stop_process(proc)
        raise ProcessStartError(f"sim {role}: {line!r}\n{_log_tail(log_path)}")
    proc.url = line.split()[1].decode()
    proc.extra["kv_events_endpoint"] = f"tcp://127.0.0.1:{kv_events_port}"
    return proc


# what a process that lost its port to another one logs (Rust's io::Error, Python's OSError)
_PORT_TAKEN = ("Address already in use", "address in use", "os error 98", "Errno 98")
PORT_ATTEMPTS = 4  # fresh ports tried before a start that keeps losing its port gives up


def lost_its_port(log_path: Path) -> bool:
    """The process's log says a bind failed because the port was taken."""
    tail = _log_tail(log_path, 40)
    return any(marker in tail for marker in _PORT_TAKEN)


async def start_vllm_router(
    prefill_url: str, decode_url: str, log_dir: Path, start_timeout_s: float = 60.0
) -> RunningProcess:
    """`vllm-router --vllm-pd-disaggregation` over one prefill and one decode engine.

    NixlConnector mode (`--kv-connector nixl`, its default) needs no bootstrap port: the router
    runs the prefill leg, then hands its `kv_transfer_params` to the decode leg, which is the
    protocol the simulated engines speak.

    vllm-router binds the ports it is told (no port 0, no inherited socket), so a port picked
    free here can be taken by another process before it binds (proxy-lean-5's A/B lost a run
    to it): a start whose log says the address is in use is retried on fresh ports, up to
    `PORT_ATTEMPTS` times; any other start failure is raised at once.
    """
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return await _start_vllm_router_once(
                prefill_url, decode_url, log_dir, start_timeout_s, attempt
            )
        except ProcessStartError as err:
            if attempt == PORT_ATTEMPTS or not err.port_taken:
                raise
    raise AssertionError("unreachable")  # the loop returns or raises


async def _start_vllm_router_once(
    prefill_url: str, decode_url: str, log_dir: Path, start_timeout_s: float, attempt: int
) -> RunningProcess:
    port, metrics_port = free_ports(2)
    log_path = log_dir / ("vllm-router.log" if attempt == 1 else f"vllm-router-{attempt}.log")
    cmd = [
        venv_bin("vllm-router"),
        "--vllm-pd-disaggregation",
        "--prefill",
        prefill_url,
        "--decode",
        decode_url,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-port",
        str(metrics_port),
        "--policy",
        "round_robin",
        "--worker-startup-check-interval",
        "1",
        "--log-level",
        "warning",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: ASYNC220  (start-up only, not the timed path)
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    proc = RunningProcess("vllm-router", f"http://127.0.0.1:{port}", process, log_path)
    try:
        await _wait_http(proc, "/health", start_timeout_s)
    except ProcessStartError as err:
        stop_process(proc)
        err.port_taken = lost_its_port(log_path)
        raise
    return proc


def write_pdorch_fleet(
    path: Path,
    *,
    served_model_name: str,
    prefill: RunningProcess,
    decode: RunningProcess,
    port: int,
    leg_client: str | None = None,
) -> None:
    """A fleet file over the already-running engines; every request disaggregated
    (`min_uncached_tokens: 0`), tokens approximated from characters (vllm-router's
    `cache_aware` also works on text, so neither proxy makes a tokenizer call). Health probes
    tolerate a starved machine (5 s, 3 failures to eject): with the defaults (0.5 s, one
    failure) a 2-core box at load average 15-20 ejected the only decode engine mid-run and
    pdorch answered 502s (20 % of a C=32 run, 2026-12-01); vllm-router probes nothing on
    this path. `leg_client`: `coordinator.leg_client` (None: the default)."""
    leg = "" if leg_client is None else f", leg_client: {leg_client}"
    text = f"""\
served_model_name: {served_model_name}
block_size: 16
pools:
  prefill:
    endpoints:
      - id: prefill-0
        url: {prefill.url}
        kv_events_endpoint: {prefill.extra["kv_events_endpoint"]}
        kv_events_topic: prefill
  decode:
    endpoints:
      - id: decode-0
        url: {decode.url}
        kv_events_endpoint: {decode.extra["kv_events_endpoint"]}
        kv_events_topic: decode
pd: {{enabled: true, min_uncached_tokens: 0}}
tokenizer: {{mode: chars}}
health: {{timeout_s: 5.0, probe_failures_to_eject: 3}}
coordinator: {{host: 127.0.0.1, port: {port}{leg}}}
"""
    path.write_text(text)


def pdorch_serve_available() -> str | None:
    """None when `pdorch serve` exists, else why not."""
    try:
        result = subprocess.run(
            [venv_bin("pdorch"), "serve", "--help"],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"pdorch serve: {err}"
    if result.returncode != 0:
        return "`pdorch serve` is not available in this checkout"
    return None


async def start_pdorch(
    config_path: Path,
    port: int,
    log_dir: Path,
    *,
    use_serve: bool = True,
    start_timeout_s: float = 90.0,
    serve_args: Sequence[str] = (),
    workers: int = 1,
    name: str = "pdorch",
) -> RunningProcess:
    """`pdorch serve --config` (or, with `use_serve=False`, `benchmarks.proxy.pdorch_runner`:
    the same `run_coordinator` path without the CLI) in its own process; `serve_args` are
    more `pdorch serve` options (e.g. `--sync-bind`). `workers` > 1: `pdorch serve --workers N
    --json`, returned once its JSON line (printed when every worker serves) is in the log."""
    log_path = log_dir / ("pdorch-serve.log" if workers == 1 else f"pdorch-serve-w{workers}.log")
    if name != "pdorch":
        log_path = log_dir / f"{name}-serve.log"
    if workers > 1 and not use_serve:
        raise RuntimeError("--workers needs `pdorch serve` in this checkout")
    if use_serve:
        cmd = [venv_bin("pdorch"), "serve", "--config", str(config_path), "--port", str(port)]
        cmd += serve_args
        if workers > 1:
            cmd += ["--workers", str(workers), "--json"]
    else:
        cmd = [sys.executable, "-m", "benchmarks.proxy.pdorch_runner"]
        cmd += ["--config", str(config_path), "--port", str(port)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: ASYNC220  (start-up only, not the timed path)
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    proc = RunningProcess(name, f"http://127.0.0.1:{port}", process, log_path)
    await _wait_http(proc, "/health", start_timeout_s)
    if workers > 1:  # /health answers once one worker listens; the JSON line once all do
        deadline = time.monotonic() + start_timeout_s
        while '"workers": [' not in log_path.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                stop_process(proc)
                raise RuntimeError(f"pdorch serve --workers {workers} did not start")
            await asyncio.sleep(0.1)
    return proc
