"""`pdorch profile --sweep`: from the timing model, and measured against a live simulated engine."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import httpx

from autoscale.perf_model import SweepPerfModel
from autoscale.perf_sweep import Sweep
from pools.sim.timing import make_timing
from tests.waiting import wait_until

CLI = [sys.executable, "-c", "from pdorch.cli import main; main()"]


def _profile(*args: str) -> dict[str, object]:
    done = subprocess.run(
        [*CLI, "profile", "--model-profile", "llama-3.1-8b", "--gpu", "h100", *args],
        capture_output=True,
        timeout=300,
        check=True,
    )
    out: dict[str, object] = json.loads(done.stdout)
    return out


def test_timing_model_sweep_writes_the_file(tmp_path: Path) -> None:
    data = _profile(
        "--sweep", "--out", str(tmp_path / "s.json"), "--json", "--isl-tokens", "512,4096"
    )
    sweep = Sweep.load(tmp_path / "s.json")
    assert sweep.to_json() == data
    timing = make_timing("llama-3.1-8b", "h100")
    assert sweep.prefill == {512: timing.prefill_time(512), 4096: timing.prefill_time(4096)}
    assert (256, 512) in sweep.decode and sweep.source == "timing-model"


def test_live_sweep_against_a_sim_engine_compares_with_the_model(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*CLI, "engine", "sim", "--port", "0", "--model-profile", "llama-3.1-8b", "--gpu", "h100",
         "--max-model-len", "4096", "--kv-transport", "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().decode().split()[1]
        wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, 20.0, message="health")
        data = _profile(
            "--sweep", "--url", url, "--compare", "--json", "--out", str(tmp_path / "live.json"),
            "--isl-tokens", "128,2048", "--batches", "1,4", "--context-tokens", "256",
            "--decode-tokens", "8", "--repeats", "2",
        )  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    sweep = Sweep.load(tmp_path / "live.json")
    assert sweep.source == "url" and sweep.url == url
    assert set(sweep.prefill) == {128, 2048} and set(sweep.decode) == {(1, 256), (4, 256)}
    # the sim's /metrics has no cache_config_info: the KV pool is the timing model's
    assert sweep.kv_capacity_tokens == make_timing("llama-3.1-8b", "h100").kv_capacity_tokens
    # measured in real time: a 2048-token prefill (~55 ms on the model) is slower than 128
    assert sweep.prefill[2048] > sweep.prefill[128]
    assert sweep.engine_prefill and sweep.engine_decode  # the engine's own histograms
    compare = data["compare"]
    assert isinstance(compare, dict)
    for curve in ("prefill", "decode"):
        assert math.isfinite(compare["summary"][curve]["mape"])
    # the sim runs the timing model: its engine-side TTFT at 2048 tokens is the model's
    assert (
        abs(sweep.engine_prefill[2048] / make_timing("llama-3.1-8b", "h100").prefill_time(2048) - 1)
        < 0.25
    )
    assert SweepPerfModel(sweep).decode_max_batch(256, 1.0) > 0
