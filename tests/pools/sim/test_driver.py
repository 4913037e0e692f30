"""The one engine driver loop (`pools/sim/driver.py`) against hand-stepping the core."""

from __future__ import annotations

import copy
from typing import Any

from pools.sim.config import EngineConfig
from pools.sim.driver import EngineDriver
from pools.sim.engine_core import EngineCore, StepResult
from pools.sim.kv_events import KVCacheEvent
from pools.sim.request import SimRequest
from pools.sim.timing import make_timing
from tests.pools.sim.test_fast_forward import prepare, state
from transfer.params import KvTransferParams

TIMING = make_timing("llama-3.1-8b", "h100")


def make_core(**kw: Any) -> EngineCore:
    cfg: dict[str, Any] = {"block_size": 16, "num_gpu_blocks": 300, "vocab_size": 4096}
    cfg.update(kw)
    return EngineCore(EngineConfig(**cfg), TIMING)


def prompt(n: int, start: int = 1) -> list[int]:
    return [(start + i) % 4000 + 10 for i in range(n)]


def add_mix(core: EngineCore, t: float) -> None:
    """Shared prefixes (cache hits), chunked prefill, enough blocks used to preempt."""
    for i in range(8):
        core.add_request(
            SimRequest(f"r{i}", prompt(64) + prompt(200 + 150 * i, 97 * i), max_tokens=60 + 9 * i),
            t,
        )


def test_tick_sees_the_same_steps_outputs_and_events_as_hand_stepping() -> None:
    hand, driven = make_core(max_num_batched_tokens=512), make_core(max_num_batched_tokens=512)
    add_mix(hand, 0.0)
    add_mix(driven, 0.0)

    expected: list[tuple[float, float, list[Any], list[KVCacheEvent]]] = []
    now = 0.0
    while (t := hand.next_step_time(now)) is not None:
        res = hand.step(t)
        now = res.end
        expected.append((res.start, res.end, res.outputs, hand.drain_events()))
    assert hand.stats().num_preemptions > 0 and hand.stats().prefix_cache_hits > 0

    seen: list[tuple[float, float, list[Any], list[KVCacheEvent]]] = []

    def on_outputs(res: StepResult, events: list[KVCacheEvent]) -> None:
        seen.append((res.start, res.end, res.outputs, events))

    driver = EngineDriver(driven)
    wake: float | None = 0.0
    while wake is not None:
        wake = driver.tick(wake, on_outputs).wake
    assert seen == expected
    assert driven.stats() == hand.stats()


def test_a_step_completes_at_a_later_tick_even_with_zero_length() -> None:
    core = make_core(num_gpu_blocks=4)  # 3 usable blocks: a 100-token prompt never fits
    core.add_request(SimRequest("big", prompt(100), max_tokens=4), 5.0)
    driver = EngineDriver(core)
    calls: list[StepResult] = []
    adv = driver.tick(5.0, lambda res, ev: calls.append(res))
    assert adv.step is not None and adv.step.duration_s == 0.0 and adv.wake == 5.0
    assert not adv.busy and calls == []  # started now, completes at the next tick
    adv = driver.tick(5.0, lambda res, ev: calls.append(res))
    assert len(calls) == 1 and calls[0].outputs == []
    assert adv.wake is None  # nothing changed since: idle until new input


def test_a_step_in_flight_is_not_completed_early() -> None:
    core = make_core()
    core.add_request(SimRequest("a", prompt(300), max_tokens=3), 0.0)
    driver = EngineDriver(core)
    adv = driver.tick(0.0)
    assert adv.step is not None and adv.busy
    end = adv.step.end
    core.add_request(SimRequest("b", prompt(40, 777), max_tokens=3), end / 2)
    assert driver.wake_time(end / 2) == end  # new input waits for the step in flight
    calls: list[StepResult] = []
    again = driver.tick(end / 2, lambda res, ev: calls.append(res))
    assert again.wake == end and again.step is None and calls == []
    nxt = driver.tick(end, lambda res, ev: calls.append(res))
    assert len(calls) == 1 and calls[0].end == end
    assert nxt.step is not None and "b" in nxt.step.num_scheduled_by_request


def test_lease_expiry_is_a_timer_wake() -> None:
    core = make_core(kv_lease_duration_s=30.0)
    core.add_request(
        SimRequest(
            "p", prompt(50), max_tokens=1, kv_transfer_params=KvTransferParams.prefill_request()
        ),
        0.0,
    )
    driver = EngineDriver(core)
    wake = driver.tick(0.0).wake
    assert wake is not None
    finished: list[float] = []
    adv = driver.tick(wake, lambda res, ev: finished.extend(res.end for o in res.outputs))
    assert finished == [wake] and core.stats().num_held_blocks == 4
    assert adv.step is None and adv.wake == wake + 30.0  # nothing runs until the lease ends
    assert not adv.busy
    driver.tick(adv.wake)  # the expiry step frees the held blocks
    assert core.stats().num_held_blocks == 0


def test_horizon_runs_the_fast_forward_mode_with_the_same_result_as_stepping() -> None:
    for token_free in (False, True):
        check_horizon_fast_forward(token_free)


def check_horizon_fast_forward(token_free: bool) -> None:
    fast = make_core(num_gpu_blocks=120)
    t = prepare(fast, token_free)
    fast.drain_events()
    slow = copy.deepcopy(fast)
    until = t + 0.35
    adv = EngineDriver(fast).tick(t, horizon=lambda: until)
    ff = adv.fast_forward
    assert ff is not None and ff.num_steps > 20 and adv.wake == ff.end <= until
    slow_driver = EngineDriver(slow)
    ends: list[float] = []
    slow_events: list[KVCacheEvent] = []

    def collect(res: StepResult, events: list[KVCacheEvent]) -> None:
        ends.append(res.end)
        slow_events.extend(events)

    wake: float | None = t
    while wake is not None and wake < ff.end:
        wake = slow_driver.tick(wake, collect).wake
    # at the stretch's end both start the same next step (the slow one completes its last)
    fast_next = EngineDriver(fast).tick(ff.end).step
    slow_next = slow_driver.tick(ff.end, collect).step
    assert ends == ff.step_ends
    assert adv.events == slow_events
    assert fast_next == slow_next and fast_next is not None
    assert state(fast) == state(slow)
