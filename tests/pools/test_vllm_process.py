"""Process management of `RunningVllm`, against `FakeVllmInterpreter` (a stand-in, see below).

A real engine needs a minute of CPU per start; its start/stop path is covered by the e2e
tests. Here a fake interpreter, started exactly like vLLM (same argv, same environment, its
own process group), plays the failure modes a real engine cannot be made to show on demand:
a crash with a long log, a hang before healthy, a child process, ignoring SIGTERM.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import psutil
import pytest

from pools.vllm_process import RunningVllm, VllmEngineError, VllmPortInUseError
from pools.vllm_spec import local_engine_spec
from tests.waiting import wait_until

# Behaviour is picked by --served-model-name; the model "directory" receives the child's pid.
FAKE_VLLM_INTERPRETER = """\
import http.server, os, signal, subprocess, sys, time
args = sys.argv[1:]
value = lambda name: args[args.index(name) + 1]
mode, port, model = value("--served-model-name"), int(value("--port")), value("--model")
assert args[:2] == ["-m", "vllm.entrypoints.openai.api_server"], args
print("env side channel", os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"], flush=True)
if mode == "crash":
    for i in range(60):
        print(f"line {i}", flush=True)
    sys.exit(3)
if mode == "hang":
    time.sleep(600)
if mode == "side-taken":
    # as vLLM's NIXL handshake listener: the bind fails in a thread, the server stays up unhealthy
    import socket, traceback
    try:
        socket.create_server(("127.0.0.1", int(os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"])))
    except OSError:
        traceback.print_exc()
        sys.stdout.flush()
    time.sleep(600)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.path.join(model, "child.pid"), "w") as f:
    f.write(str(child.pid))
METRICS = b'vllm:cache_config_info{block_size="32",num_gpu_blocks="77"} 1.0\\n'
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"" if self.path == "/health" else METRICS
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture
def fake_interpreter(tmp_path: Path) -> str:
    script = tmp_path / "fake-vllm-python"
    script.write_text(f"#!{sys.executable}\n{FAKE_VLLM_INTERPRETER}")
    script.chmod(0o755)
    return str(script)


def engine(tmp_path: Path, mode: str, interpreter: str) -> RunningVllm:
    spec = local_engine_spec(
        tmp_path,
        served_model_name=mode,
    )
    return RunningVllm(spec, tmp_path / "logs" / f"{mode}.log", python=interpreter)


def gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def test_healthy_engine_reports_its_pool_and_stop_takes_the_whole_group(
    tmp_path: Path, fake_interpreter: str
) -> None:
    running = engine(tmp_path, "healthy", fake_interpreter)
    assert running.num_gpu_blocks is None
    running.start()
    try:
        running.wait_healthy(timeout_s=30)
        assert running.num_gpu_blocks == 77
        pid_file = tmp_path / "child.pid"
        wait_until(lambda: pid_file.exists() and pid_file.read_text(), 10, message="child pid")
        child = int(pid_file.read_text())
        assert os.getpgid(child) == running.pid
    finally:
        code = running.stop(grace=10)
    assert code is not None
    wait_until(lambda: gone(child), 10, message="the engine's child to be killed")
    assert "env side channel" in running.log_path.read_text()
    assert running.stop() == code  # idempotent


def test_crash_during_start_raises_with_the_last_log_lines(
    tmp_path: Path, fake_interpreter: str
) -> None:
    running = engine(tmp_path, "crash", fake_interpreter)
    running.start()
    try:
        with pytest.raises(VllmEngineError) as crashed:
            running.wait_healthy(timeout_s=30)
    finally:
        running.stop()
    message = str(crashed.value)
    assert "exited with status 3" in message
    assert "line 59" in message and "line 20" in message
    assert "line 19\n" not in message  # only the last 40 lines
    assert str(running.log_path) in message


def test_engine_not_healthy_by_the_deadline_raises(tmp_path: Path, fake_interpreter: str) -> None:
    running = engine(tmp_path, "hang", fake_interpreter)
    running.start()
    try:
        with pytest.raises(VllmEngineError, match="not healthy within 1s"):
            running.wait_healthy(timeout_s=1)
    finally:
        running.stop(grace=5)
    assert running.returncode is not None


def test_engine_whose_side_channel_port_is_taken_fails_at_once_as_port_in_use(
    tmp_path: Path, fake_interpreter: str
) -> None:
    running = engine(tmp_path, "side-taken", fake_interpreter)
    # another process's socket on the engine's side-channel port (a real taken port)
    with socket.create_server(("127.0.0.1", running.side_channel_port)):
        running.start()
        try:
            # without the bind check this waits out the whole timeout as a plain not-healthy
            with pytest.raises(VllmPortInUseError, match="could not bind a port"):
                running.wait_healthy(timeout_s=120)
        finally:
            running.stop(grace=5)


def test_engine_ignoring_sigterm_is_killed_after_the_grace_period(
    tmp_path: Path, fake_interpreter: str
) -> None:
    running = engine(tmp_path, "stubborn", fake_interpreter)
    running.start()
    try:
        running.wait_healthy(timeout_s=30)
    finally:
        code = running.stop(grace=0.5)
    assert code == -9


async def test_async_start_and_stop(tmp_path: Path, fake_interpreter: str) -> None:
    running = engine(tmp_path, "healthy", fake_interpreter)
    running.start()
    try:
        await running.wait_healthy_async(timeout_s=30)
        assert running.num_gpu_blocks == 77
    finally:
        code = await running.stop_async(grace=10)
    assert code is not None


@pytest.mark.e2e
def test_real_vllm_refusing_its_settings_is_reported_with_its_log(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """vLLM itself rejects a max_model_len beyond the model's positions: the error shows why."""
    spec = local_engine_spec(
        tiny_model_dir,
        max_model_len=1_000_000,
        cpu_cores="1",
    )
    running = RunningVllm(spec, tmp_path / "refused.log")
    running.start()
    try:
        with pytest.raises(VllmEngineError) as refused:
            running.wait_healthy(timeout_s=300)
    finally:
        running.stop()
    message = str(refused.value)
    assert "exited with status" in message
    assert "max_model_len" in message or "max-model-len" in message, message


@pytest.mark.e2e
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to keep one free")
def test_real_connector_engine_without_pinned_cores_keeps_a_core_free_of_openmp(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """On 2 cores vLLM would keep no core free of OpenMP threads with NixlConnector, and the
    connector's pin then pairs two of them on one core (`VllmEngineSpec.env`): the engine's own
    binding report must show a reserved core."""
    spec = local_engine_spec(
        tiny_model_dir,
        max_model_len=512,
        num_gpu_blocks_override=32,
    )
    assert spec.kv_transfer and spec.cpu_cores is None
    with RunningVllm(spec, tmp_path / "engine.log") as running:
        log = running.log_path.read_text(errors="replace")
    assert "OpenMP thread binding info" in log, log[-4000:]
    assert "reserved_cpus=[]" not in log, log[-4000:]
