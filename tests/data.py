"""Where the tests' data lives in the repository (one place, not a path literal per test).

Every file here is committed: a fresh clone needs nothing beside it. The vLLM captures are in
`tests/fixtures/vllm/` (test-only); the public traces are in `benchmarks/traces/`, named by
`benchmarks.workloads.traces` because the studies and the CLI examples read them too. A missing
or damaged file fails the tests instead of skipping them (`tests/test_data_checksums.py` checks
the bytes against each folder's `SHA256SUMS`).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.workloads.traces import AZURE_CONVERSATION, MOONCAKE_CONVERSATION, TRACES_DIR

__all__ = [
    "AZURE_CONVERSATION",
    "CHECKSUMMED_DIRS",
    "MOONCAKE_CONVERSATION",
    "REPO",
    "TRACES_DIR",
    "VLLM_FIXTURES",
    "require_file",
]

REPO = Path(__file__).resolve().parents[1]
VLLM_FIXTURES = REPO / "tests" / "fixtures" / "vllm"
# The folders whose data files are listed, with their sha256, in a `SHA256SUMS` beside them.
CHECKSUMMED_DIRS = (VLLM_FIXTURES, TRACES_DIR / "mooncake", TRACES_DIR / "azure")


def require_file(path: Path) -> Path:
    """`path`, asserting it is in the checkout (a clear failure, never a skip)."""
    assert path.is_file(), f"{path} missing: it is committed data; is the checkout complete?"
    return path
