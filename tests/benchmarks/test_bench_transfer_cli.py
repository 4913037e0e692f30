"""`pdorch bench transfer --json`: exactly one JSON object on stdout, every row verified."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.transfer.owner_process import REPO


def test_bench_transfer_json_contract() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from pdorch.cli import main; main()",
            "bench",
            "transfer",
            "--total-mib",
            "2",
            "--methods",
            "memcpy,tcp_mover",
            "--block-kib",
            "16",
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)  # the whole of stdout is one object
    rows = report["rows"]
    assert {(r["method"], r["block_bytes"], r["pattern"]) for r in rows} == {
        (m, b, p)
        for m in ("memcpy", "tcp_mover")
        for b in (16 << 10,)
        for p in ("contiguous", "scattered")
    }
    for row in rows:
        assert row["verified"] is True, row
        assert row["gbps"] > 0
        assert row["ratio_to_memcpy"] is not None
    assert [t["met"] for t in report["targets"]] == [None, None]  # nixl_shm not run
