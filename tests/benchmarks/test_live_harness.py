"""`pdorch bench live` against a real local OpenAI server: a `pdorch engine sim` process.

The engine runs at `--time-scale 0.01` with the byte-level tokenizer (1 token per byte), so
workloads here are scaled down (short prompts); the harness is exercised end to end: real
processes, real HTTP streaming, the real CLI with `--json`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.live.url_guard import RemoteUrlError, check_target_url
from tests.sim_process import SimProcess

MAX_MODEL_LEN = 32768


SIM_ARGS = [
    "--port", "0", "--time-scale", "0.01", "--kv-transport", "none",
    "--max-model-len", str(MAX_MODEL_LEN), "--served-model-name", "sim-model",
]  # fmt: skip


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    engine = SimProcess(SIM_ARGS, tmp_path_factory.mktemp("sim") / "engine.log")
    try:
        yield engine.wait_ready(120.0)
    finally:
        engine.stop()


def bench_live(*args: str, timeout: float = 120.0) -> tuple[int, dict[str, Any] | None, str]:
    """Run the real CLI; return (exit code, the --json object or None, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-c", "from pdorch.cli import main; main()", "bench", "live", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    data = json.loads(lines[0]) if lines else None
    if data is not None:
        assert len(lines) == 1, "exactly one JSON object on stdout"
    return proc.returncode, data, proc.stderr


def _prefix_hits(url: str) -> float:
    text = httpx.get(f"{url}/metrics", trust_env=False, timeout=10).text
    m = re.search(r"^vllm:prefix_cache_hits_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    assert m, "prefix cache hit counter in /metrics"
    return float(m.group(1))


def test_shared_prefix_run_is_complete_and_sane(sim_url: str, tmp_path: Path) -> None:
    hits_before = _prefix_hits(sim_url)
    code, data, err = bench_live(
        "--url", sim_url, "--workload", "shared-prefix", "--json", "--out", str(tmp_path),
        "--param", "users=6", "--param", "turns=2", "--param", "prefix_tokens=256",
        "--param", "question_median=16", "--param", "output_median=12",
        "--param", "think_median_s=0.05", "--rate-scale", "20",
    )  # fmt: skip
    assert code == 0, err
    assert data is not None
    assert data["model"] == "sim-model"  # discovered from /v1/models
    assert data["planned"] == 12 and data["completed"] == 12
    assert data["errors"] == 0 and data["cancelled"] == 0
    assert data["output_tokens_short"] == 0
    for name in ("ttft", "itl", "tpot", "e2e"):
        p50, p99 = data[f"{name}_p50_ms"], data[f"{name}_p99_ms"]
        assert p50 is not None and 0 <= p50 <= p99 < 30_000, name
    assert data["ttft_p50_ms"] > 0
    assert data["requests_per_s"] > 0 and data["output_tokens_per_s"] > 0
    # byte-level fallback tokenizer: ~1 token per byte, a rendered word is ~6 bytes
    assert 3.0 < data["prompt_tokens_ratio"] < 10.0
    rows = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 12
    wl_outputs = sorted(r["output_tokens"] for r in rows)
    assert data["output_tokens"] == sum(wl_outputs)
    for r in rows:
        assert r["error"] is None and r["ttft_s"] > 0 and r["end_s"] >= r["start_s"]
        assert len(r["itl_s"]) <= r["output_tokens"] - 1
    assert json.loads((tmp_path / "results.json").read_text())["completed"] == 12
    # users share the rendered system prompt: the engine's prefix cache must see it
    assert _prefix_hits(sim_url) - hits_before >= 5 * 256


def test_rl_rollouts_closed_loop_reports_rollout_latency(sim_url: str) -> None:
    code, data, err = bench_live(
        "--url", sim_url, "--workload", "rl-rollouts", "--json",
        "--param", "steps=3", "--param", "turns=3", "--param", "prompt_tokens=64",
        "--param", "output_tokens=16", "--param", "straggler_output_tokens=128",
        "--concurrency", "8",
    )  # fmt: skip
    assert code == 0, err
    assert data is not None
    assert data["completed"] == data["planned"] == 3 * 8 * 3
    assert data["output_tokens"] == 3 * (8 * 3 * 16 + 2 * (128 - 16))
    assert data["rollouts_planned"] == data["rollouts_completed"] == 3
    assert 0 < data["rollout_p50_s"] <= data["rollout_p99_s"] <= data["rollout_max_s"]
    assert data["rollout_max_s"] * 1000 >= data["e2e_p99_ms"]


def test_open_loop_arrivals_follow_the_trace_clock(sim_url: str, tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:00.0,40,4\n2023-11-16 18:00:01.0,40,4\n2023-11-16 18:00:02.0,40,4\n"
    )
    code, data, err = bench_live(
        "--url", sim_url, "--trace", str(trace), "--rate-scale", "2", "--json",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 0, err
    assert data is not None and data["completed"] == 3
    rows = [json.loads(x) for x in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    starts = sorted(r["start_s"] for r in rows)
    # trace arrivals 0, 1, 2 s at rate scale 2 -> 0, 0.5, 1.0 s after the run starts
    for got, want in zip(starts, (0.0, 0.5, 1.0), strict=True):
        assert want - 0.01 <= got <= want + 0.25


def test_duration_and_max_requests_bound_the_run(sim_url: str) -> None:
    t0 = time.monotonic()
    code, data, err = bench_live(
        "--url", sim_url, "--workload", "agentic", "--json", "--duration-s", "1.5",
        "--param", "system_tokens=128", "--param", "tool_median=32",
        "--param", "task_median=32", "--param", "rate=20",
    )  # fmt: skip
    elapsed = time.monotonic() - t0
    assert code == 0, err
    assert data is not None
    # Generous: the bound under test is "stops near --duration-s" (the next assert shows work
    # was left undone); a loaded 2-core machine stretches the teardown by seconds.
    assert data["wall_s"] < 10.0 and elapsed < 30
    assert data["completed"] > 0 and data["errors"] == 0
    assert data["completed"] + data["cancelled"] < data["planned"]
    code, data, err = bench_live(
        "--url", sim_url, "--workload", "agentic", "--json", "--max-requests", "5",
        "--param", "system_tokens=64", "--param", "tool_median=16",
        "--param", "task_median=16", "--param", "output_median=8", "--rate-scale", "100",
        "--api", "completions",
    )  # fmt: skip
    assert code == 0, err
    assert data is not None
    assert data["completed"] == 5 and data["planned"] == 5 and data["api"] == "completions"


def test_errors_are_counted_with_their_message(sim_url: str, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 100, "output_length": 3, "hash_ids": [0]},
        # renders to ~6 bytes per token: far over the engine's max model length
        {"timestamp": 0, "input_length": 20000, "output_length": 3, "hash_ids": list(range(40))},
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, data, err = bench_live("--url", sim_url, "--trace", str(trace), "--json")
    assert code == 0, err
    assert data is not None
    assert data["completed"] == 1 and data["errors"] == 1
    assert data["error_samples"] and data["error_samples"][0].startswith("HTTP 400")


def test_refuses_non_loopback_urls_without_the_flag() -> None:
    code, data, err = bench_live("--url", "http://192.0.2.1:8000", "--workload", "agentic")
    assert code == 2 and data is None
    assert "--allow-remote" in err
    assert check_target_url("http://localhost:8000/") == "http://localhost:8000"
    assert check_target_url("http://[::1]:80") == "http://[::1]:80"
    assert check_target_url("http://127.0.0.5:1") == "http://127.0.0.5:1"
    assert check_target_url("https://example.org", allow_remote=True) == "https://example.org"
    for bad in ("http://example.org", "http://10.1.2.3:80", "http://0.0.0.0:80"):
        with pytest.raises(RemoteUrlError):
            check_target_url(bad)
    with pytest.raises(ValueError, match="http"):
        check_target_url("ftp://127.0.0.1")


def test_bad_arguments_fail_before_any_traffic(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9"  # discard port: nothing may be sent there
    code, data, err = bench_live("--url", url, "--workload", "rl-rollouts", "--param", "stepz=2")
    assert code == 2 and data is None and "'stepz'" in err
    code, data, err = bench_live("--url", url)
    assert code == 2 and "exactly one of --workload" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    code, data, err = bench_live("--url", url, "--trace", str(bad))
    assert code == 2 and "line 1" in err and "input_length" in err
