"""`pdorch bench router --json` on a tiny size: one JSON object on stdout, the promised shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PDORCH = Path(sys.executable).with_name("pdorch")


def run_bench(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PDORCH), "bench", "router", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_json_shape_on_a_tiny_size(tmp_path: Path) -> None:
    out = tmp_path / "router.json"
    proc = run_bench(
        "--json",
        "--prompt-tokens",
        "64",
        "--prompt-tokens",
        "160",
        "--replicas",
        "2,3",  # a list option takes commas as well as repeats
        "--iterations",
        "5",
        "--ingest-blocks",
        "400",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout  # exactly one JSON object on stdout
    data = json.loads(lines[0])
    assert json.loads(out.read_text()) == data
    assert [(d["prompt_tokens"], d["replicas"]) for d in data["decision"]] == [
        (64, 2),
        (64, 3),
        (160, 2),
        (160, 3),
    ]
    for d in data["decision"]:
        assert d["iterations"] == 5
        assert 0 < d["p50_us"] <= d["p99_us"]
        assert d["cpu_p50_us"] > 0
        # every replica holds its 256 background blocks (+ a prefix of the shared prompt)
        assert d["index_entries"] >= 256 * d["replicas"]
        assert d["index_distinct_keys"] <= d["index_entries"]
        assert d["index_bytes_per_entry"] > 0
        assert d["index_bytes_per_key"] >= d["index_bytes_per_entry"]
    assert data["ingest_blocks_per_s"] > 0
    assert data["ingest_blocks"] >= 400
    assert set(data["targets_met"]) == {"decision_p99", "ingest"}
    assert data["targets_met"]["decision_p99"] is None  # 8k x 64 not measured here
    assert "pdorch bench router" in proc.stderr  # the table went to stderr


def test_table_without_json_and_ingest_skipped() -> None:
    proc = run_bench(
        "--prompt-tokens", "32", "--replicas", "1", "--iterations", "3", "--ingest-blocks", "0"
    )
    assert proc.returncode == 0, proc.stderr
    assert "p99 µs" in proc.stdout
    assert "ingestion" not in proc.stdout
    assert not proc.stdout.lstrip().startswith("{")


def test_help_teaches_the_options() -> None:
    proc = run_bench("--help")
    assert proc.returncode == 0
    for option in ("--prompt-tokens", "--replicas", "--iterations", "--ingest-blocks", "--json"):
        assert option in proc.stdout


def test_policy_picks_the_profile_and_a_bad_param_names_the_flag() -> None:
    proc = run_bench(
        "--json",
        "--policy",
        "token_load@remaining_decode=true",
        "--prompt-tokens",
        "64",
        "--replicas",
        "12",
        "--iterations",
        "3",
        "--ingest-blocks",
        "0",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["policy"] == "token_load@remaining_decode=true"
    bad = run_bench("--policy", "token_load@remaining_decod=true", "--ingest-blocks", "0")
    assert bad.returncode != 0
    assert "--policy" in bad.stderr and "remaining_decod" in bad.stderr
