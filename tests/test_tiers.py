"""`make test`'s tier runner (tests/tiers.py) and the tier markers (tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiers import NO_TESTS_COLLECTED, TIERS, tier_passed

REPO = Path(__file__).resolve().parents[1]


def _tiers(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.tiers", *args, "-q", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_no_tests_collected_fails_the_whole_suite_but_not_a_narrowed_run() -> None:
    assert tier_passed(0, narrowed=False) and tier_passed(0, narrowed=True)
    assert not tier_passed(NO_TESTS_COLLECTED, narrowed=False)
    assert tier_passed(NO_TESTS_COLLECTED, narrowed=True)
    assert not tier_passed(1, narrowed=True)


def test_tiers_split_the_markers_without_overlap() -> None:
    assert [t.marks for t in TIERS] == ["not e2e", "e2e and not vllm_pair", "e2e and vllm_pair"]


@pytest.mark.integration
def test_a_narrowed_run_passes_with_empty_e2e_tiers() -> None:
    done = _tiers("tests/router/test_token_load.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout[done.stdout.rindex("=== tiers") :]
    assert "fast      passed" in summary
    assert summary.count("empty") == 2


@pytest.mark.integration
def test_a_failing_tier_fails_the_run_and_later_tiers_still_run() -> None:
    done = _tiers("tests/no_such_file.py")  # pytest exits 4 (usage error) in every tier
    assert done.returncode == 4
    summary = done.stdout[done.stdout.rindex("=== tiers") :]
    assert summary.count("FAILED (pytest exit 4)") == 3


@pytest.mark.integration
def test_a_unit_test_that_opens_a_socket_fails(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\nfrom tests.conftest import *  # noqa\n"
    )
    (tmp_path / "test_leaky.py").write_text(
        "import socket\n\n"
        "def test_binds():\n"
        "    with socket.socket() as s:\n"
        "        s.bind(('127.0.0.1', 0))\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout[-3000:]
    assert "unit test used real parts (socket.bind)" in done.stdout
