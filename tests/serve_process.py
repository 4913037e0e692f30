"""`pdorch serve --config FILE --port 0 --json` as a real process, for tests that need the CLI's
whole path (its logging, its signal handling): started, its JSON line read for the URL, and
stopped with its whole process group (the engines it launched) at the end."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.waiting import wait_until

PDORCH = [sys.executable, "-c", "from pdorch.cli import main; main()"]


@dataclass
class ServeProcess:
    url: str
    process: subprocess.Popen[bytes]
    stderr: Path  # the process's whole stderr (its log)


@contextlib.contextmanager
def serve_command(
    args: list[str], tmp_path: Path, start_timeout_s: float = 120.0
) -> Iterator[tuple[dict[str, Any], subprocess.Popen[bytes], Path]]:
    """`pdorch serve ARGS --port 0 --json` in its own process group: its JSON line (parsed),
    the process and its stderr file; on exit SIGINT to the group, SIGKILL after 30 s."""
    err = tmp_path / "serve.err"
    with err.open("wb") as log:
        process = subprocess.Popen(
            [*PDORCH, "serve", *args, "--port", "0", "--json"],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        stdout = process.stdout
        assert stdout is not None
        wait_until(
            lambda: bool(select.select([stdout], [], [], 0)[0]) or process.poll() is not None,
            timeout=start_timeout_s,
            message="pdorch serve's JSON line",
        )
        line = stdout.readline()
        assert line, err.read_text()
        yield json.loads(line), process, err
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@contextlib.contextmanager
def serve_process(
    config: dict[str, Any], tmp_path: Path, start_timeout_s: float = 120.0
) -> Iterator[ServeProcess]:
    """`config` written as the fleet file, then `serve_command(["--config", FILE])`."""
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(config))
    with serve_command(["--config", str(path)], tmp_path, start_timeout_s) as (
        info,
        process,
        err,
    ):
        yield ServeProcess(str(info["url"]), process, err)
