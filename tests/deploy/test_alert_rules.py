"""The SLO alerts (components/monitoring/prometheusrule.yaml) through the real promtool: the rules
are valid, a broken one is refused, and on synthetic series they fire above the SLO policy's
targets and not below."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.kustomize import rule_exprs, rule_groups

pytestmark = pytest.mark.integration  # runs promtool


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian package prometheus; .ci/run installs it)")
    return path


def test_promtool_accepts_the_alert_rules(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups()}))
    done = subprocess.run(
        [_promtool(), "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rule_exprs())} rules found" in done.stdout


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    """The check above can fail: the same file with one expression broken does not pass."""
    groups = rule_groups()
    groups[0]["rules"][0]["expr"] = "histogram_quantile(0.9, sum by (le (rate(x[5m])))"
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    done = subprocess.run(
        [_promtool(), "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0


def _series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": values}


def test_promtool_alerts_fire_above_the_targets_and_not_below(tmp_path: Path) -> None:
    """`promtool test rules` on synthetic series: prefill TTFT observations in (1, 2.5] s
    (p90 2.35 s > 2 s) fire, decode's in [0, 1] s do not; ITL in (0.05, 0.1] s (p90 95 ms)
    fires, in [0, 25] ms not; a pool whose ready count drops to 0 fires."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups()}))
    ttft, itl = (
        "pdorch_time_to_first_token_seconds_bucket",
        "pdorch_inter_token_latency_seconds_bucket",
    )
    grow, flat = "0+10x30", "0+0x30"
    series = [
        _series(ttft, 'pool="prefill",le="1"', flat),
        _series(ttft, 'pool="prefill",le="2.5"', grow),
        _series(ttft, 'pool="prefill",le="+Inf"', grow),
        _series(ttft, 'pool="decode",le="1"', grow),
        _series(ttft, 'pool="decode",le="+Inf"', grow),
        _series(itl, 'pool="decode",le="0.025"', grow),
        _series(itl, 'pool="decode",le="+Inf"', grow),
        _series(itl, 'pool="colocated",le="0.05"', flat),
        _series(itl, 'pool="colocated",le="0.1"', grow),
        _series(itl, 'pool="colocated",le="+Inf"', grow),
        _series("pdorch_pool_replicas", 'pool="decode",state="ready"', "1 1 0x20"),
        _series("pdorch_pool_replicas", 'pool="prefill",state="ready"', "2x20"),
    ]
    ttft_alert = {
        "exp_labels": {"severity": "warning", "pool": "prefill"},
        "exp_annotations": {
            "summary": "p90 TTFT of pool prefill is 2.35s (SLO target 2 s)",
            "description": "Prefill capacity short of the load: check the autoscaler's last "
            "decisions (pdorch scale status) and pending replicas.",
        },
    }
    itl_alert = {
        "exp_labels": {"severity": "warning", "pool": "colocated"},
        "exp_annotations": {
            "summary": "p90 ITL of pool colocated is 95ms (SLO target 50 ms)",
            "description": "Decode capacity or KV headroom short of the load: check decode KV "
            "usage and pending replicas.",
        },
    }
    none_ready = {
        "exp_labels": {"severity": "critical", "pool": "decode"},
        "exp_annotations": {"summary": "pool decode has no ready replica"},
    }
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "3m", "alertname": "PdorchTTFTAboveSLO", "exp_alerts": []},
                    {
                        "eval_time": "15m",
                        "alertname": "PdorchTTFTAboveSLO",
                        "exp_alerts": [ttft_alert],
                    },
                    {
                        "eval_time": "15m",
                        "alertname": "PdorchITLAboveSLO",
                        "exp_alerts": [itl_alert],
                    },
                    {
                        "eval_time": "10m",
                        "alertname": "PdorchPoolHasNoReadyReplica",
                        "exp_alerts": [none_ready],
                    },
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(tests, width=1000))
    done = subprocess.run(
        [_promtool(), "test", "rules", "test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
