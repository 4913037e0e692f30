"""Rendering segments to text: deterministic, equal segments → equal text, prefix-consistent."""

from __future__ import annotations

from benchmarks.workloads import Segment, SessionSpec, TurnSpec, load_workload, output_content_id
from benchmarks.workloads.text import (
    WORDS,
    chat_messages,
    completion_prompt,
    render_segment,
    render_segments,
)
from tests.data import MOONCAKE_CONVERSATION, require_file


def test_segment_text_is_deterministic_and_sized() -> None:
    a = render_segment(12345, 300)
    assert a == render_segment(12345, 300)
    words = a.split(" ")
    assert words[0] == "" and len(words) == 301  # leading space, one word per token
    assert all(w in WORDS for w in words[1:])
    assert render_segment(12346, 300) != a
    assert render_segment(12345, 0) == ""


def test_shorter_segment_is_a_prefix_of_the_longer() -> None:
    full = render_segment(987, 512)
    for n in (1, 100, 511):
        assert full.startswith(render_segment(987, n))


def test_equal_segments_equal_text_in_any_prompt() -> None:
    shared = [Segment(1, 64), Segment(2, 32)]
    a = render_segments([*shared, Segment(3, 10)])
    b = render_segments([*shared, Segment(4, 10)])
    prefix = render_segments(shared)
    assert a.startswith(prefix) and b.startswith(prefix) and a != b


def test_mooncake_blocks_render_identically_across_requests() -> None:
    w = load_workload(require_file(MOONCAKE_CONVERSATION), max_requests=50)
    texts = [render_segments(s.turns[0].new_segments) for s in w.sessions]
    first_block = render_segment(w.sessions[0].turns[0].new_segments[0].content_id, 512)
    assert all(t.startswith(first_block) for t in texts)  # block 0 is in every request


def test_chat_messages_multi_turn() -> None:
    s = SessionSpec(
        "sess",
        0.0,
        [
            TurnSpec([Segment(10, 20), Segment(11, 5)], 7),
            TurnSpec([Segment(12, 8)], 9, think_time_s=1.0),
            TurnSpec([], 3),
        ],
    )
    m0 = chat_messages(s, 0)
    assert m0 == [{"role": "user", "content": render_segments(s.turns[0].new_segments)}]
    m2 = chat_messages(s, 2)
    assert [m["role"] for m in m2] == ["user", "assistant", "user", "assistant", "user"]
    assert m2[:1] == m0
    assert m2[1]["content"] == render_segment(output_content_id("sess", 0), 7)
    assert m2[3]["content"] == render_segment(output_content_id("sess", 1), 9)
    assert m2[4]["content"] == " continue"  # an empty turn still sends a user message
    assert chat_messages(s, 2) == m2
    assert completion_prompt(s, 1) == render_segments(s.prompt_segments(1))


def test_trace_rows_are_single_messages() -> None:
    s = SessionSpec("r", 0.0, [TurnSpec([Segment(5, 12)], 2)], carry_context=False)
    assert chat_messages(s, 0) == [{"role": "user", "content": render_segment(5, 12)}]


def test_rl_rollout_step_shares_prompt_text() -> None:
    w = load_workload("rl-rollouts", steps=1, prompt_tokens=256)
    firsts = {chat_messages(s, 0)[0]["content"] for s in w.sessions}
    assert len(firsts) == 1
    seconds = {chat_messages(s, 1)[1]["content"] for s in w.sessions}
    assert len(seconds) == 8  # each rollout's own output
