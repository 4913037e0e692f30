"""The virtual-time fleet simulator on small workloads (seconds each)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.fleet_sim import FleetSpec, SimConfig, run_simulation
from benchmarks.fleet_sim.block_ids import BlockChain
from benchmarks.fleet_sim.metrics import check_conservation, compute_metrics
from benchmarks.workloads.model import Segment, SessionSpec, TurnSpec, Workload
from pools.sim.timing import make_timing

PDORCH = Path(sys.executable).with_name("pdorch")


def chat_workload(n: int = 24, turns: int = 3, seed: int = 0) -> Workload:
    """Multi-turn chats behind a shared system prompt, open loop."""
    import random

    rng = random.Random(seed)
    sessions = []
    for i in range(n):
        spec = [
            TurnSpec(
                [Segment(1, 1024), Segment(1000 + i * 10 + k, rng.randint(100, 2500))],
                rng.randint(10, 200),
                think_time_s=0.3,
            )
            for k in range(turns)
        ]
        sessions.append(SessionSpec(f"s{i}", i * 0.25, spec, group=f"g{i % 4}"))
    return Workload("chat", sessions)


@pytest.mark.parametrize("fleet", ["2P2D", "4C", "1P2D1C"])
def test_conservation_every_request_finishes_once_and_tokens_add_up(fleet: str) -> None:
    wl = chat_workload()
    res = run_simulation(wl, SimConfig(FleetSpec.parse(fleet), policy="token_load"))
    assert check_conservation(res) == []
    m = compute_metrics(res)
    assert m["completed"] == wl.num_requests == len(res.requests)
    assert 0 < m["hit_rate"] <= m["oracle_hit_rate"] + 1e-9
    assert "rollout_p99_s" in m
    if fleet == "2P2D":
        assert m["disaggregated_fraction"] > 0.5


def test_same_seed_same_results() -> None:
    wl = chat_workload()
    cfg = SimConfig(FleetSpec.parse("2P2D"), policy="dynamo", seed=3)
    a = compute_metrics(run_simulation(wl, cfg))
    b = compute_metrics(run_simulation(wl, cfg))
    for key in ("sim_wall_s", "sim_cpu_s"):
        a.pop(key)
        b.pop(key)
    assert a == b


@pytest.mark.parametrize("fleet", ["2P2D", "3C"])
def test_fast_forward_equivalence(fleet: str) -> None:
    wl = chat_workload(n=16)
    fast = run_simulation(wl, SimConfig(FleetSpec.parse(fleet), fast_forward=True))
    slow = run_simulation(wl, SimConfig(FleetSpec.parse(fleet), fast_forward=False))
    assert fast.num_fast_forward_steps > 0 and slow.num_fast_forward_steps == 0
    assert fast.requests == slow.requests
    assert sorted(fast.itl_samples) == sorted(slow.itl_samples)  # same gaps, other order
    assert fast.decode_kv_blocks == slow.decode_kv_blocks
    assert fast.num_steps == slow.num_steps


def test_pd_transfer_time_is_applied() -> None:
    prompt = 6000
    wl = Workload("one", [SessionSpec("s", 0.0, [TurnSpec([Segment(7, prompt)], output_tokens=2)])])
    res = run_simulation(wl, SimConfig(FleetSpec.parse("1P1D"), block_size=16))
    (rec,) = res.requests
    assert rec.disaggregated and rec.transfer_tokens == prompt
    timing = make_timing("llama-3.1-8b", "h100")
    prefill = timing.prefill_time(prompt)
    transfer = timing.kv_transfer_time(prompt)
    assert rec.first_token is not None
    ttft = rec.first_token - rec.arrival
    # prefill leg, then the KV transfer, then one decode-side step for the last prompt token
    assert ttft >= prefill + transfer
    assert ttft <= prefill + transfer + 0.05


def hot_spot() -> Workload:
    """Many users behind one long system prompt arriving fast: the hot-spot test."""
    sessions = [
        SessionSpec(
            f"u{i}",
            i * 0.02,
            [TurnSpec([Segment(42, 6144), Segment(5000 + i, 200)], output_tokens=300)],
        )
        for i in range(120)
    ]
    return Workload("hot-spot", sessions)


def test_kv_overlap_piles_up_where_token_load_spreads() -> None:
    wl = hot_spot()
    used = {}
    ttft = {}
    for policy in ("kv_overlap", "token_load"):
        res = run_simulation(wl, SimConfig(FleetSpec.parse("4C"), policy=policy))
        assert check_conservation(res) == []
        used[policy] = Counter(r.decode_replica for r in res.requests)
        ttft[policy] = compute_metrics(res)["ttft_p95_ms"]
    assert max(used["kv_overlap"].values()) >= 110  # nearly all on the replica with the prefix
    assert len(used["token_load"]) == 4
    assert max(used["token_load"].values()) <= 60
    assert ttft["token_load"] < ttft["kv_overlap"]


def test_block_chain_ids_follow_token_positions() -> None:
    a = BlockChain(64)
    a.extend([Segment(1, 100), Segment(2, 100)])
    b = BlockChain(64)
    b.extend([Segment(1, 100), Segment(2, 100), Segment(3, 50)])
    assert b.ids[: len(a.ids)] == a.ids and len(a.ids) == 3 and len(b.ids) == 3
    c = BlockChain(64)
    c.extend([Segment(1, 100), Segment(9, 100)])
    assert c.ids[0] == a.ids[0] and c.ids[1] != a.ids[1]
    d = BlockChain(64)
    d.extend([Segment(1, 60), Segment(1, 40)])  # same content id, other segmentation
    assert d.ids[0] != a.ids[0]


@pytest.mark.integration
def test_bench_sim_json_shape(tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = subprocess.run(
        [
            str(PDORCH),
            "bench",
            "sim",
            "--workload",
            "rl-rollouts",
            "--param",
            "steps=1",
            "--param",
            "turns=2",
            "--param",
            "output_tokens=64",
            "--param",
            "straggler_output_tokens=256",
            "--policies",
            "token_load,round_robin",
            "--fleet",
            "2C",
            "--json",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert set(data) == {"policies", "wall_s"}
    keys = {
        "ttft_p50_ms",
        "ttft_p95_ms",
        "ttft_p99_ms",
        "itl_p50_ms",
        "itl_p99_ms",
        "output_tokens_per_s",
        "goodput_rps",
        "hit_rate",
        "oracle_hit_rate",
        "decode_blocks_cv",
        "completed",
        "rollout_p99_s",
    }
    assert set(data["policies"]) == {"token_load", "round_robin"}
    for row in data["policies"].values():
        assert set(row) == keys
        assert row["completed"] == 16
    for name in ("report.md", "results.json", "ttft_cdf.png", "load_balance.png", "hit_rate.png"):
        assert (out / name).is_file()


def _bench_sim(*args: str) -> subprocess.CompletedProcess[str]:
    base = [str(PDORCH), "bench", "sim", "--workload", "rl-rollouts", "--param", "steps=1"]
    small = ["--param", "turns=2", "--param", "output_tokens=32", "--fleet", "2P2D", "--json"]
    return subprocess.run(
        [*base, *small, *args], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.integration
def test_bench_sim_runs_a_fleet_files_router_config(tmp_path: Path) -> None:
    # The demo fleet file routes as the `token_load` benchmark name does (token_load prefill,
    # token_load_decode decode, P/D defaults): both rows must be the same run.
    fleet = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "fleet-sim.yaml"
    llmd = tmp_path / "mine.yaml"
    llmd.write_text("router:\n  prefill: {name: llmd}\n  decode: {name: llmd}\n")
    proc = _bench_sim(
        "--policies", "token_load,llmd", "--router-config", str(fleet), "--router-config", str(llmd)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)["policies"]
    assert set(rows) == {"token_load", "llmd", "fleet-sim", "mine"}
    assert rows["fleet-sim"] == rows["token_load"]
    assert rows["mine"] == rows["llmd"]
    assert rows["fleet-sim"] != rows["mine"]


@pytest.mark.integration
def test_bench_sim_router_config_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("decode: {name: token_load_decode, params: {kv_headroom_margin: 2}}\n")
    proc = _bench_sim("--router-config", str(bad))
    assert proc.returncode != 0
    assert "decode.params.kv_headroom_margin" in proc.stderr
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "served_model_name: m\npools:\n  decode:\n    policy: {name: nope}\n"
        "    endpoints: [{url: 'http://127.0.0.1:1'}]\n"
    )
    proc = _bench_sim("--router-config", str(fleet))
    assert proc.returncode != 0
    assert "pools.decode.policy.name" in proc.stderr
