"""The real benchmark clients' make target, docs and committed command lines (the clients are
too large for CI; docs/benchmark-clients.md). Checks that they exist and parse, nothing more."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "bench-clients"
CLIENTS = ("guidellm", "aiperf")


@pytest.mark.integration
def test_make_target_installs_each_client_from_its_pinned_requirements() -> None:
    # -B: print the recipes even where the venvs are already installed.
    make = ["make", "-n", "-B", "bench-clients"]
    out = subprocess.run(make, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for client in CLIENTS:
        req = ROOT / "benchmarks" / "bench_clients" / f"requirements-{client}.txt"
        pins = [ln for ln in req.read_text().splitlines() if ln and not ln.startswith("#")]
        assert pins and all("==" in ln for ln in pins), req
        install = f".bench-clients/{client}/bin/python -m pip install --quiet -r"
        assert f"{install} {req.relative_to(ROOT)}" in out


@pytest.mark.integration
def test_committed_run_scripts_parse() -> None:
    scripts = sorted(RESULTS.glob("run-*.sh"))
    names = {
        "run-vllm-bench-serve.sh",
        "run-pdorch-bench-live.sh",
        "run-aiperf.sh",
        "run-guidellm.sh",
    }
    assert {s.name for s in scripts} >= names
    for script in scripts:
        subprocess.run(["bash", "-n", str(script)], check=True)


def test_docs_name_every_client_and_the_offline_workarounds() -> None:
    text = (ROOT / "docs" / "benchmark-clients.md").read_text()
    needles = ("make bench-clients", "guidellm", "aiperf", "vllm bench serve", "HF_HUB_OFFLINE")
    for needle in needles:
        assert needle in text, needle
