"""Synthetic workloads: shapes, determinism, identity of shared content, parameters."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from benchmarks.workloads import (
    Segment,
    SessionSpec,
    TurnSpec,
    Workload,
    load_workload,
    output_content_id,
    workload_names,
)


def _as_tuple(w: Workload) -> list[object]:
    return [
        (s.session_id, s.start_s, s.group, s.carry_context,
         [(t.new_segments, t.output_tokens, t.think_time_s) for t in s.turns])
        for s in w.sessions
    ]  # fmt: skip


def test_registry_names() -> None:
    assert workload_names() == ["agentic", "diurnal", "rl-rollouts", "shared-prefix"]


@pytest.mark.parametrize("name", ["rl-rollouts", "agentic", "shared-prefix"])
def test_deterministic_from_seed(name: str) -> None:
    a = load_workload(name, seed=3)
    b = load_workload(name, seed=3)
    c = load_workload(name, seed=4)
    assert _as_tuple(a) == _as_tuple(b)
    assert _as_tuple(a) != _as_tuple(c)


def test_rl_rollouts_shape_and_stragglers() -> None:
    w = load_workload("rl-rollouts")
    assert w.concurrency == 16
    assert len(w.sessions) == 4 * 8
    assert w.num_requests == 4 * 8 * 10
    by_group: dict[str | None, list[SessionSpec]] = defaultdict(list)
    for s in w.sessions:
        assert s.start_s is None and s.carry_context
        assert len(s.turns) == 10
        by_group[s.group].append(s)
    assert sorted(str(g) for g in by_group) == [f"rollout/step-{k}" for k in range(4)]
    straggler_sets = []
    for group, sessions in by_group.items():
        assert len(sessions) == 8
        last_outputs = [s.turns[-1].output_tokens for s in sessions]
        assert sorted(last_outputs) == [1024] * 6 + [8192] * 2, group
        straggler_sets.append(tuple(o == 8192 for o in last_outputs))
        for s in sessions:
            assert all(t.output_tokens == 1024 for t in s.turns[:-1])
            assert s.prompt_tokens(0) == 2048
            # 2k prompt + 1k per earlier turn (no observation tokens by default)
            assert [s.prompt_tokens(k) for k in range(10)] == [2048 + 1024 * k for k in range(10)]
        # GRPO reading: a step's rollouts share their prompt, outputs differ per rollout
        prompts = {s.turns[0].new_segments[0] for s in sessions}
        assert len(prompts) == 1
        outs = {s.prompt_segments(1)[1] for s in sessions}
        assert len(outs) == 8
    # steps share nothing; the seed picks different stragglers across steps
    first_segments = {by_group[g][0].turns[0].new_segments[0] for g in by_group}
    assert len(first_segments) == 4
    assert len(set(straggler_sets)) > 1


def test_rl_rollouts_params() -> None:
    w = load_workload(
        "rl-rollouts", steps=2, turns=3, shared_prompt=False, observation_tokens=16, concurrency=8
    )
    assert w.concurrency == 8 and len(w.sessions) == 16
    assert len({s.turns[0].new_segments[0] for s in w.sessions}) == 16
    s = w.sessions[0]
    assert s.prompt_tokens(2) == 2048 + 2 * (16 + 1024)
    with pytest.raises(ValueError, match="stragglers"):
        load_workload("rl-rollouts", stragglers=9)
    with pytest.raises(ValueError, match="'stepz'"):
        load_workload("rl-rollouts", stepz=2)
    with pytest.raises(ValueError, match="'steps'"):
        load_workload("rl-rollouts", steps=0)


def test_agentic_shape() -> None:
    w = load_workload("agentic", sessions=300)
    assert len(w.sessions) == 300 and w.concurrency is None
    starts = [s.start_s for s in w.sessions if s.start_s is not None]
    assert len(starts) == len(w.sessions)  # every session has a start time
    assert starts[0] == 0.0 and starts == sorted(starts)
    # Poisson at 0.2/s: ~1500 s for 300 sessions (generous bounds, the draw is seeded)
    assert starts[-1] is not None and 1000 < starts[-1] < 2200
    turns = sorted(len(s.turns) for s in w.sessions)
    assert turns[0] >= 1 and turns[len(turns) // 2] in range(5, 13) and turns[-1] >= 40
    outputs = [t.output_tokens for s in w.sessions for t in s.turns]
    assert min(outputs) < 30 and max(outputs) > 2000  # widely varying
    for s in w.sessions:
        assert s.prompt_tokens(len(s.turns) - 1) + s.turns[-1].output_tokens <= 131072
        assert s.turns[0].think_time_s == 0.0
        assert all(t.think_time_s > 0 for t in s.turns[1:])
    # all sessions start with one of the 2 shared system prompts
    systems = Counter(s.turns[0].new_segments[0] for s in w.sessions)
    assert len(systems) == 2 and all(seg.num_tokens == 8192 for seg in systems)
    # contexts grow: turn k's prompt starts with turn k-1's prompt and output
    s = max(w.sessions, key=lambda x: len(x.turns))
    p2, p3 = s.prompt_segments(2), s.prompt_segments(3)
    assert p3[: len(p2)] == p2
    assert p3[len(p2)] == Segment(output_content_id(s.session_id, 2), s.turns[2].output_tokens)


def test_agentic_rate_scale_divides_arrivals() -> None:
    a = load_workload("agentic", sessions=20)
    b = load_workload("agentic", sessions=20, rate_scale=4.0)
    for x, y in zip(a.sessions, b.sessions, strict=True):
        assert x.start_s is not None and y.start_s is not None
        assert y.start_s == pytest.approx(x.start_s / 4.0)
        assert [t.output_tokens for t in x.turns] == [t.output_tokens for t in y.turns]


def test_shared_prefix_identity() -> None:
    w = load_workload("shared-prefix", users=50, turns=3, prefix_tokens=4096)
    assert len(w.sessions) == 50 and w.num_requests == 150
    heads = {s.turns[0].new_segments[0] for s in w.sessions}
    assert len(heads) == 1 and heads.pop().num_tokens == 4096
    questions = {s.turns[0].new_segments[1] for s in w.sessions}
    assert len(questions) == 50  # only the prefix is shared
    for s in w.sessions:
        assert [len(t.new_segments) for t in s.turns] == [2, 1, 1]
    multi = load_workload("shared-prefix", users=40, prefixes=4)
    assert len({s.turns[0].new_segments[0] for s in multi.sessions}) == 4


def test_unknown_name_is_clear() -> None:
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        load_workload("nope")


def test_prompt_segments_without_context() -> None:
    s = SessionSpec(
        "x", 0.0, [TurnSpec([Segment(1, 5)], 3), TurnSpec([Segment(2, 7)], 4)], carry_context=False
    )
    assert s.prompt_segments(1) == [Segment(2, 7)] and s.prompt_tokens(1) == 7
    s.carry_context = True
    assert s.prompt_segments(1) == [
        Segment(1, 5),
        Segment(output_content_id("x", 0), 3),
        Segment(2, 7),
    ]
    assert s.prompt_tokens(1) == 15
