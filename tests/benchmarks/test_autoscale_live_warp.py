"""The live benchmark's time compression: stretched observations, the cold-start floor, the
compressed workload, token-id prompts of exact length (pure code)."""

from __future__ import annotations

from autoscale.policy import parse_policy
from autoscale.signals import LatencySummary, Observation, Pool, PoolStatus, ReplicaSignals
from benchmarks.autoscale_live.fleet import compress_workload
from benchmarks.autoscale_live.warp import (
    ColdStartFloor,
    VirtualClock,
    real_time_policy,
    stretch_observation,
)
from benchmarks.workloads.model import Segment, SessionSpec, TurnSpec, Workload
from benchmarks.workloads.text import TOKEN_ID_OFFSET, TOKEN_ID_RANGE, completion_token_ids


def test_stretch_multiplies_times_by_the_compression_and_nothing_else() -> None:
    obs = Observation(
        now=50.0,
        window_s=5.0,
        pools={Pool.DECODE: PoolStatus(ready=2)},
        num_requests=10,
        arrival_rps=2.0,
        mean_isl_tokens=900.0,
        ttft=LatencySummary(count=10, p50_s=0.1, p90_s=0.2, p99_s=0.4, mean_s=0.15),
        itl=LatencySummary(count=10, p50_s=0.005, p90_s=0.008, p99_s=None, mean_s=0.006),
        replicas=(ReplicaSignals("decode-0", Pool.DECODE, num_running=7, mean_step_s=0.004),),
    )
    out = stretch_observation(obs, 0.2)
    assert out.ttft.p90_s is not None and abs(out.ttft.p90_s - 1.0) < 1e-12
    assert out.ttft.count == 10 and out.itl.p99_s is None
    assert out.itl.mean_s is not None and abs(out.itl.mean_s - 0.03) < 1e-12
    assert (
        out.replicas[0].mean_step_s is not None and abs(out.replicas[0].mean_step_s - 0.02) < 1e-12
    )
    assert out.replicas[0].num_running == 7
    # the clock is already virtual: window, rate and counts stay
    assert (out.now, out.window_s, out.arrival_rps, out.mean_isl_tokens) == (50.0, 5.0, 2.0, 900.0)


def test_virtual_clock_and_real_time_policy() -> None:
    t = [100.0]
    clock = VirtualClock(0.25, clock=lambda: t[0])
    t[0] = 102.0
    assert clock() == 8.0 and clock.real(8.0) == 102.0
    policy = parse_policy({"pools": {"decode": {"drain_timeout_s": 60, "startup_s": 30}}})
    real = real_time_policy(policy, 0.25)
    assert real.limits(Pool.DECODE).drain_timeout_s == 15.0
    assert real.limits(Pool.DECODE).startup_s == 7.5
    assert real.limits(Pool.DECODE).max == policy.limits(Pool.DECODE).max
    assert real.slo == policy.slo and real.intervals == policy.intervals


def test_cold_start_floor_counts_from_each_replicas_start() -> None:
    t = [0.0]
    live = {"decode-1": False, "decode-2": True, "decode-3": True}
    floor = ColdStartFloor(
        inner=lambda rid: live[rid],
        floor_s=lambda pool: 6.0 if pool == "decode" else 0.0,
        pool_of=lambda rid: rid.split("-")[0],
        clock=lambda: t[0],
    )
    floor.started("decode-1")  # asked for at t = 0
    t[0] = 3.0
    floor.started("decode-2")  # asked for at t = 3; its process is up first
    assert not floor("decode-2")
    t[0] = 6.0
    assert not floor("decode-2")  # 3 s after its own start, not 6
    assert not floor("decode-1")  # past its floor, but its own check says not yet
    live["decode-1"] = True
    assert floor("decode-1")
    t[0] = 9.0
    assert floor("decode-2")
    assert not floor("decode-3")  # never reported started: counts from its first check
    t[0] = 15.0
    assert floor("decode-3")


def test_compressed_workload_and_token_ids() -> None:
    session = SessionSpec(
        "s",
        10.0,
        [TurnSpec([Segment(7, 100), Segment(8, 5)], 20), TurnSpec([Segment(9, 3)], 4, 2.0)],
        carry_context=True,
    )
    wl = compress_workload(Workload("w", [session]), 0.1)
    assert wl.sessions[0].start_s == 1.0 and wl.sessions[0].turns[1].think_time_s == 0.2
    assert session.start_s == 10.0  # the original is untouched
    for turn in (0, 1):
        ids = completion_token_ids(session, turn)
        assert len(ids) == session.prompt_tokens(turn)
        assert all(TOKEN_ID_OFFSET <= i < TOKEN_ID_OFFSET + TOKEN_ID_RANGE for i in ids)
    # a segment's ids are a prefix of the longer segment's (as the rendered text is)
    short = SessionSpec("a", 0.0, [TurnSpec([Segment(7, 40)], 1)], carry_context=False)
    assert completion_token_ids(short, 0) == completion_token_ids(session, 0)[:40]
