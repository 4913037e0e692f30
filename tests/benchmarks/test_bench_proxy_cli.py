"""`pdorch bench proxy --json` on a tiny run: one JSON object on stdout, the promised shape.

Real processes: two simulated engines, `pdorch serve` and vllm-router (a dev dependency; when
it is not installed it must be listed under `skipped`, never silently missing).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

PDORCH = Path(sys.executable).with_name("pdorch")
HAS_VLLM_ROUTER = (Path(sys.executable).with_name("vllm-router")).exists() or bool(
    shutil.which("vllm-router")
)


def test_json_shape_on_a_tiny_run(tmp_path: Path) -> None:
    out = tmp_path / "proxy.json"
    proc = subprocess.run(
        [
            str(PDORCH),
            "bench",
            "proxy",
            "--json",
            "--requests",
            "12",
            "--warmup",
            "2",
            "--concurrency",
            "1,3",
            "--rounds",
            "2",
            "--targets",
            "direct,vllm-router,pdorch",
            "--log-dir",
            str(tmp_path / "logs"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)  # exactly one JSON object, nothing else on stdout
    assert json.loads(out.read_text()) == result

    rows = {(r["target"], r["concurrency"]): r for r in result["rows"]}
    ran = {target for target, _ in rows}
    assert ran | set(result["skipped"]) == {"direct", "vllm-router", "pdorch"}
    assert "direct" in ran and "pdorch" in ran, result["skipped"]
    if HAS_VLLM_ROUTER:
        assert "vllm-router" in ran, result["skipped"]
    for target in ran:
        for concurrency in (1, 3):
            row = rows[(target, concurrency)]
            assert {"target", "concurrency", "rps", "p50_ms", "p99_ms"} <= set(row)
            assert row["ok"] == 12 and row["errors"] == 0, row["first_error"]
            # `--rounds 2`: the 12 requests ran as two interleaved rounds, summed in the row
            assert len(row["rps_rounds"]) == 2 and min(row["rps_rounds"]) > 0
            assert row["rps"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]
            # every request really went through P/D: the decode engine pulled its prompt
            assert row["remote_prefill_frac"] == 1.0
            assert row["added_p50_ms"] is not None
    assert rows[("direct", 1)]["added_p50_ms"] == 0.0
    assert rows[("direct", 1)]["proxy_cpu_us_per_req"] is None


def test_streamed_run_checks_every_stream(tmp_path: Path) -> None:
    """`--stream`: every answer is SSE through the proxy and must end with [DONE] after
    max_tokens token events (`_Worker._check`), for the floor and the proxy alike."""
    proc = subprocess.run(
        [
            str(PDORCH),
            "bench",
            "proxy",
            "--json",
            "--stream",
            "--max-tokens",
            "24",
            "--requests",
            "8",
            "--warmup",
            "1",
            "--concurrency",
            "2",
            "--targets",
            "direct,pdorch",
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["config"]["stream"] is True and result["config"]["max_tokens"] == 24
    rows = {r["target"]: r for r in result["rows"]}
    assert set(rows) == {"direct", "pdorch"}, result["skipped"]
    for row in rows.values():
        assert row["ok"] == 8 and row["errors"] == 0, row["first_error"]
        assert row["remote_prefill_frac"] == 1.0
