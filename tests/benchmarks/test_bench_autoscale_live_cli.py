"""`pdorch bench autoscale --live`: a tiny live replay on real processes, beside its what-if.

The command runs as its own process (the coordinator in it, every replica a `pdorch engine
sim` process started and stopped by the local actuator, the in-process control loop, the live
load client), over ~90 requests of the Azure conversation trace at 10x compression. Starting
at 2P2D, the first minute's low load makes both pools scale down (each while the load runs),
the ramp after it makes at least one pool scale back up. Asserted: no request failed (non-200,
error event, truncated or short stream), the scale-ups and scale-downs, every drain finished
without a cut, the `--json` object's fields and the `--out` files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.data import AZURE_CONVERSATION, REPO

# the live policy's shape, shorter still: cold start 10 s, scale-down after 5 s (virtual)
POLICY = """\
model_profile: qwen3-32b
gpu: a100
pools:
  prefill: {min: 1, max: 2, startup_s: 10, drain_timeout_s: 60}
  decode: {min: 1, max: 2, startup_s: 10, drain_timeout_s: 60}
gpu_budget: 4
intervals: {predictive_s: 10, reactive_s: 2.5}
stabilization: {scale_up_s: 0, scale_down_s: 5}
perf_model: {source: timing-model}
planner: {cold_start_spare: null}  # as slo-policy-live.yaml: no standing decode spare
"""


def test_live_replay_scales_both_ways_and_loses_nothing(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-c",
        "from pdorch.cli import main; main()",
        "bench",
        "autoscale",
        "--live",
        "--trace",
        str(AZURE_CONVERSATION),
        "--policy",
        str(policy),
        "--initial-fleet",
        "2P2D",
        "--rate-scale",
        "0.3",
        "--max-requests",
        "300",
        "--time-scale",
        "0.1",
        "--json",
        "--out",
        str(out),
    ]
    # on a timeout: SIGINT first (the command stops the engines it started, each in a session
    # of its own), then SIGKILL to the command's process group
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    report = json.loads(stdout)  # the whole of stdout is one object

    live = report["live"]
    assert report["failed"] == 0 and live["failed"] == 0, live["failed_samples"]
    assert live["requests"] == live["completed"] > 50
    assert all(report["scale_downs"][pool] >= 1 for pool in ("prefill", "decode")), report
    assert sum(report["scale_ups"].values()) >= 1, report
    assert live["drains"], live
    for drain in live["drains"]:
        assert drain["timed_out"] is False and drain["cut"] == 0, drain
    for pool in ("prefill", "decode"):
        assert set(report["lifecycle_s"][pool]) == {"ready", "drained"}
    assert live["failed_starts"] == {}, live
    # every replica that joined waited for its emulated cold start (startup_s 10 virtual s);
    # a start the planner cancels again before it is ready never joins
    ready = [s for pool in ("prefill", "decode") for s in report["lifecycle_s"][pool]["ready"]]
    assert all(s >= 10.0 for s in ready), ready
    assert {"attainment", "scale_ups", "scale_downs", "lifecycle_s", "lost"} <= set(
        report["whatif"]
    )
    assert report["whatif"]["requests"] == live["requests"]
    metrics = {row["metric"] for row in report["comparison"]}
    assert {"requests", "GPU-hours", "prefill: decision → ready, mean s"} <= metrics
    assert set(report["agreement"]) == {"prefill", "decode"}
    for name in ("results.json", "report.md", "timeline.png"):
        assert (out / name).stat().st_size > 0, name
    assert "--live" in (out / "report.md").read_text(encoding="utf-8")
