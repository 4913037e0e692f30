"""`pdorch engine sim` as a real subprocess for tests: started with the CLI as users run it,
ready when it prints its one `ready <url>` line, stopped with SIGTERM (killed if it hangs)."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
from pathlib import Path

from tests.waiting import wait_until

PDORCH = [sys.executable, "-c", "from pdorch.cli import main; main()"]
"""`pdorch` as this interpreter runs it (PYTHONPATH first, as the venv's entry point does)."""


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> int:
    """SIGTERM, then SIGKILL after `timeout` seconds; the exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class SimProcess:
    """One `pdorch engine sim ARGS...` subprocess; `url` comes from its `ready <url>` line."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [*PDORCH, "engine", "sim", *args], stdout=subprocess.PIPE, stderr=self._log
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.url = ""

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._lines.put(raw.decode().rstrip("\n"))

    def wait_ready(self, timeout: float) -> str:
        """The engine's URL once it serves; fails if it exits first or prints anything else."""

        def ready() -> str | None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine sim exited with {self.proc.returncode}")
            try:
                return self._lines.get_nowait()
            except queue.Empty:
                return None

        line = wait_until(ready, timeout, message="`ready <url>` from pdorch engine sim")
        assert line.startswith("ready http://"), line
        assert self._lines.empty(), "exactly one line on stdout"
        self.url = line.split(" ", 1)[1]
        return self.url

    def stop(self) -> int:
        code = stop_process(self.proc)
        self._log.close()
        return code
