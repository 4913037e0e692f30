"""`pdorch bench soak` on a one-minute run (real processes: four `pdorch engine sim`, `pdorch
serve`, two engine restarts), the sampler's readings and what must hold after it; and the
slope / verdict arithmetic on made-up series."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.soak.trend import LIMITS, Limit, slope_per_hour, trend, verdict
from pdorch.cli.bench_soak import parse_duration

PDORCH = Path(sys.executable).with_name("pdorch")
NUM_BLOCKS = 2048  # the soak fleet's KV pool per engine (pdorch/cli/bench_soak.py)


def test_one_minute_soak_samples_and_leaks_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [str(PDORCH), "bench", "soak", "--json", "--duration", "60s", "--sample-s", "2"]
    cmd += ["--restart-every-s", "20", "--warmup-s", "10", "--concurrency", "4"]
    cmd += ["--max-tokens", "32", "--log-dir", str(tmp_path / "logs"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)  # exactly one JSON object on stdout
    assert json.loads((out / "soak.json").read_text()) == result
    assert (out / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    samples = result["samples"]
    assert len(samples) >= 15, len(samples)  # every 2 s for 60 s, on a loaded box fewer
    restarts = [(r["replica"], r["mode"]) for r in result["restarts"]]
    assert restarts == [("prefill-0", "SIGTERM"), ("decode-0", "kill -9")], result["restarts"]
    for s in samples:
        assert s["rss_mib"] > 20 and s["open_fds"] > s["sockets"] > 0, s
    running = [s for s in samples if s["tracked_requests"] > 0]
    assert running and all(s["upstream_http"] >= 1 and s["clients"] >= 1 for s in running)
    assert max(s["clients"] for s in samples) >= 4  # every load client's connection was seen
    # KV events reach the index (the engines bind their PUB sockets, the coordinator follows)
    assert max(s["index_blocks"] for s in samples) > 0
    assert result["requests"]["succeeded"] > 0
    assert result["requests"]["failed_before_first_byte"] == 0, result["requests"]["errors"]

    after = result["after"]
    # nothing is left held once the load stopped and every request returned
    assert after["token_load_zero"], after["token_load"]
    assert after["tracked_requests"] == 0 and after["requests_in_flight"] == 0
    assert after["kv_leases"] == 0
    # one KV-event SUB connection per engine, restarted ones included: none lost, none doubled
    assert after["upstream_zmq"] == 4, after
    # the clients' connections are closed, and no more fds are open than at the busiest sample
    assert after["clients"] <= 1, after
    assert after["open_fds"] <= max(s["open_fds"] for s in samples), after
    # the index holds no more than each engine's pool (no blocks kept over a restart)
    assert set(after["indexed_blocks"]) == {"prefill-0", "prefill-1", "decode-0", "decode-1"}
    assert all(0 <= n <= NUM_BLOCKS for n in after["indexed_blocks"].values()), after

    rows = result["trend"]["metrics"]
    assert set(rows) == set(LIMITS)
    assert all(r["slope_per_h"] is not None and r["samples"] >= 10 for r in rows.values())
    assert isinstance(result["trend"]["flat"], bool)


@pytest.mark.unit
def test_slope_per_hour() -> None:
    line = [(t, 5.0 + 2.0 * t / 3600) for t in range(0, 1800, 10)]  # +2 per hour
    slope = slope_per_hour(line)
    assert slope is not None and abs(slope - 2.0) < 1e-9
    assert slope_per_hour(line[:2]) is None
    assert slope_per_hour([(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)]) is None


@pytest.mark.unit
def test_verdict_flags_a_leak_and_leaves_out_the_warmup() -> None:
    limits = {"open_fds": Limit("fds", 6.0), "rss_mib": Limit("MiB", 8.0, 0.05)}
    samples = []
    for i in range(180):
        t = i * 10.0
        warm = t < 120
        samples.append(
            {
                "t_s": t,
                # steep during the warm-up, flat with noise after it
                "rss_mib": (50 + t) if warm else 200 + (i % 3),
                # one fd more every 3 minutes: 20 per hour
                "open_fds": 40 + int(t // 180),
            }
        )
    result = verdict(samples, warmup_s=120.0, limits=limits)
    assert result["not_flat"] == ["open_fds"] and not result["flat"]
    fds = result["metrics"]["open_fds"]
    assert 15 < fds["slope_per_h"] < 25 and fds["tolerance_per_h"] == 6.0
    rss = result["metrics"]["rss_mib"]
    assert rss["flat"] and rss["tolerance_per_h"] == pytest.approx(0.05 * 201)
    assert rss["first"] == 200 and rss["samples"] == 168
    # counted from 0 s the warm-up's climb makes RSS look like a leak
    assert not verdict(samples, warmup_s=0.0, limits=limits)["metrics"]["rss_mib"]["flat"]


@pytest.mark.unit
def test_too_few_samples_is_not_flat_and_info_rows_do_not_decide() -> None:
    row = trend([{"t_s": 0.0, "x": 1.0}], "x", 0.0, Limit("u", 1.0))
    assert row["slope_per_h"] is None and not row["flat"]
    samples = [{"t_s": float(t), "ok_per_s": float(t), "x": 1.0} for t in range(10)]
    limits = {"ok_per_s": Limit("r/s", 0.0, 0.2, verdict=False), "x": Limit("u", 1.0)}
    assert verdict(samples, 0.0, limits)["flat"]


@pytest.mark.unit
def test_parse_duration() -> None:
    assert parse_duration("30m") == 1800.0
    assert parse_duration("90s") == parse_duration("90") == 90.0
    assert parse_duration("1.5h") == 5400.0
    for bad in ("", "0m", "10d", "-5s", "m"):
        with pytest.raises(ValueError):
            parse_duration(bad)
