"""The proxy bench's vllm-router start survives losing its port to another process.

vllm-router binds the port it is told, so a port picked free can be taken before it binds
(proxy-lean-5's A/B lost a run to it). A stand-in `vllm-router` (a small Python script) fails
its first start the way a taken port does and serves `/health` on the second: the start must
retry on fresh ports and return the second process; a failure of any other kind must not be
retried.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchmarks.proxy import processes
from benchmarks.proxy.processes import ProcessStartError, start_vllm_router, stop_process

pytestmark = pytest.mark.integration

# first start: "address in use" and exit 1 (as vllm-router does); later: serve /health
_STUB = """\
import http.server, sys
from pathlib import Path
marker = Path(sys.argv[0]).with_suffix(".started")
port = int(sys.argv[sys.argv.index("--port") + 1])
if MODE == "other":
    print("error: no workers reachable", flush=True)
    sys.exit(1)
if not marker.exists():
    marker.write_text("1")
    print("Error: Address already in use (os error 98)", flush=True)
    sys.exit(1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _stub(tmp_path: Path, mode: str) -> Path:
    script = tmp_path / "vllm-router-stub.py"
    script.write_text(f"MODE = {mode!r}\n" + _STUB)
    wrapper = tmp_path / "vllm-router"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


async def test_a_start_that_lost_its_port_is_retried_on_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper = _stub(tmp_path, "taken-once")
    monkeypatch.setattr(processes, "venv_bin", lambda name: str(wrapper))
    proc = await start_vllm_router("http://127.0.0.1:1", "http://127.0.0.1:2", tmp_path, 20.0)
    try:
        assert proc.process.poll() is None  # the second start serves
        assert "Address already in use" in (tmp_path / "vllm-router.log").read_text()
        assert (tmp_path / "vllm-router-2.log").exists()
    finally:
        stop_process(proc)


async def test_any_other_start_failure_is_raised_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper = _stub(tmp_path, "other")
    monkeypatch.setattr(processes, "venv_bin", lambda name: str(wrapper))
    with pytest.raises(ProcessStartError, match="no workers reachable") as raised:
        await start_vllm_router("http://127.0.0.1:1", "http://127.0.0.1:2", tmp_path, 20.0)
    assert not raised.value.port_taken
    assert not (tmp_path / "vllm-router-2.log").exists()  # one start only
