"""A real Prometheus server (Debian's `prometheus` binary) for tests, cleaned up always.

    with PrometheusServer(config, tmp_path) as prom:   # config: the prometheus.yml mapping
        prom.url                                        # "http://127.0.0.1:<port>"

Started as `prometheus --config.file=... --storage.tsdb.path=<tmp> --web.listen-address=
127.0.0.1:<free port>`, ready when `/-/ready` answers. Stopped with SIGTERM (SIGKILL after a
bound) on exit, also when the test fails; on Linux the child also gets SIGKILL if the test
process dies first (PR_SET_PDEATHSIG), so no Prometheus outlives a killed pytest. Missing
binary fails the test (`.ci/run` installs it), it never skips.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import yaml

from tests.ports import free_port

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


# loaded here, not in the child: between fork and exec only the prctl call itself runs
_LIBC = ctypes.CDLL("libc.so.6", use_errno=True) if sys.platform == "linux" else None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class PrometheusServer:
    def __init__(self, config: dict[str, Any], workdir: Path) -> None:
        self.binary = shutil.which("prometheus")
        if self.binary is None:
            raise RuntimeError(
                "the prometheus binary is not installed "
                "(apt-get install -y --no-install-recommends prometheus; .ci/run does)"
            )
        self.workdir = workdir
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> PrometheusServer:
        assert self.binary is not None
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.process.returncode}: {self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/-/ready", timeout=1.0).status_code == 200:
                    return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus not ready in {READY_TIMEOUT_S} s: {self.log()}")
            time.sleep(0.05)  # polling a readiness condition with a deadline

    def log(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT_S)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
