"""`pdorch engine vllm`: refuses bad settings up front; runs, announces and stops a real engine."""

from __future__ import annotations

import concurrent.futures
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from typer.testing import CliRunner

from pdorch.cli import app
from tests.waiting import wait_until

PDORCH = str(Path(sys.executable).parent / "pdorch")
START_TIMEOUT_S = 600


def gone(pid: int) -> bool:
    """Exited (a zombie waiting for its parent counts as exited)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--role", "router"], "role"),
        (["--role", "decode", "--block-size", "16"], "block_size"),
        (["--role", "decode", "--cpu-core", "first"], "cpu_cores"),
        (["--role", "decode", "--gpu-ids", "0"], "gpu_ids"),
    ],
)
def test_bad_settings_exit_2_naming_the_field(tmp_path: Path, args: list[str], field: str) -> None:
    result = CliRunner().invoke(app, ["engine", "vllm", "--model-dir", str(tmp_path), *args])
    assert result.exit_code == 2
    assert field in result.output
    assert "ready" not in result.stdout


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_engine_vllm_prints_ready_and_stops_on_sigterm(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    log = tmp_path / "engine.log"
    command = [PDORCH, "engine", "vllm", "--model-dir", str(tiny_model_dir), "--role", "both"]
    command += ["--max-model-len", "512", "--cpu-core", "0", "--log-file", str(log)]
    # Generous: on a 2-core machine shared with other engines a start can take minutes.
    command += ["--start-timeout-s", str(START_TIMEOUT_S)]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    assert process.stdout is not None and process.stderr is not None  # both piped
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as reader:
            pending = reader.submit(process.stdout.readline)
            line = pending.result(timeout=START_TIMEOUT_S + 60)
        if not line.startswith("ready http://127.0.0.1:"):
            process.wait(timeout=60)
            pytest.fail(f"no ready line; stderr:\n{process.stderr.read()}")
        url = line.split()[1]
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        models = httpx.get(f"{url}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == tiny_model_dir.name
        group = [p.pid for p in psutil.Process(process.pid).children(recursive=True)]
        assert group, "the engine runs as a child of the command"

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        rest = process.stdout.read()
        assert rest == ""  # exactly one line on stdout
        wait_until(
            lambda: all(gone(pid) for pid in group),
            30,
            message="every engine process to exit",
        )
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=5)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
