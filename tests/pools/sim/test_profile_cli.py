"""`pdorch profile`, run as a real process."""

from __future__ import annotations

import json
import subprocess
import sys

CLI = [sys.executable, "-c", "from pdorch.cli import main; main()", "profile"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def test_json_output() -> None:
    r = run("--model-profile", "llama-3.1-8b", "--gpu", "h100", "--kv-memory-gib", "60", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["kv_bytes_per_token"] == 131072
    assert abs(data["kv_capacity_tokens"] / 490_000 - 1) < 0.15
    assert set(data["prefill_ms"]) == {"1024", "8192", "32768"}
    assert abs(data["decode_ms_per_token_batch1"] / 4.8 - 1) < 0.15
    assert abs(data["decode_ms_per_token_full_pool"] / 22 - 1) < 0.15


def test_table_and_tp() -> None:
    r = run("--model-profile", "llama-3.1-70b", "--gpu", "h200", "--tp", "2")
    assert r.returncode == 0, r.stderr
    assert "KV capacity" in r.stdout and "decode per token" in r.stdout


def test_bad_names_are_clear_errors() -> None:
    r = run("--model-profile", "nope", "--gpu", "h100", "--json")
    assert r.returncode == 2 and r.stdout == ""
    assert "unknown model 'nope'" in r.stderr and "llama-3.1-8b" in r.stderr
    r = run("--model-profile", "tiny", "--gpu", "v100")
    assert r.returncode == 2 and "unknown gpu 'v100'" in r.stderr and "h200" in r.stderr
