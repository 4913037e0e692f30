"""Trace replay: the real Mooncake and Azure files, and small malformed files."""

from __future__ import annotations

import csv
import json
from datetime import datetime
from pathlib import Path

import pytest

from benchmarks.workloads import Segment, TraceFormatError, Workload, load_workload
from benchmarks.workloads.traces import block_content_id, detect_trace_format
from tests.data import AZURE_CONVERSATION as AZURE
from tests.data import MOONCAKE_CONVERSATION as MOONCAKE
from tests.data import require_file


@pytest.fixture(scope="module")
def mooncake() -> Workload:
    return load_workload(require_file(MOONCAKE))


def test_mooncake_real_file_rows_and_lengths(mooncake: Workload) -> None:
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines() if line.strip()]
    assert len(rows) == len(mooncake.sessions) == 12_031
    assert mooncake.meta["trace_format"] == "mooncake"
    assert mooncake.meta["length_mismatch_rows"] == 0
    for row, s in zip(rows, mooncake.sessions, strict=True):
        assert not s.carry_context and len(s.turns) == 1
        assert s.start_s == pytest.approx(row["timestamp"] / 1000.0)
        turn = s.turns[0]
        assert turn.output_tokens == row["output_length"]
        assert turn.new_tokens == row["input_length"]
        assert [seg.content_id for seg in turn.new_segments] == [
            block_content_id(h) for h in row["hash_ids"]
        ]
        sizes = [seg.num_tokens for seg in turn.new_segments]
        assert sizes[:-1] == [512] * (len(sizes) - 1)
        assert sizes[-1] == row["input_length"] - 512 * (len(row["hash_ids"]) - 1)


def test_mooncake_equal_hash_ids_are_equal_segments(mooncake: Workload) -> None:
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines() if line.strip()]
    seen: dict[int, Segment] = {}
    shared = 0
    for row, s in zip(rows, mooncake.sessions, strict=True):
        segs = s.turns[0].new_segments
        for h, seg in zip(row["hash_ids"], segs, strict=True):
            if seg.num_tokens != 512:
                continue  # the partial last block: same content id, shorter
            if h in seen:
                assert seen[h] == seg
                shared += 1
            seen[h] = seg
    assert shared > 90_000  # 36.6 % of 288,500 blocks repeat (README)
    # distinct ids never collide
    assert len({seg.content_id for seg in seen.values()}) == len(seen)
    # every request starts with block 0 (the shared system block)
    assert {s.turns[0].new_segments[0].content_id for s in mooncake.sessions} == {
        block_content_id(0)
    }


def test_mooncake_rate_scale_and_max_requests() -> None:
    w = load_workload(MOONCAKE, rate_scale=4.0, max_requests=500)
    assert len(w.sessions) == 500
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()[:500]]
    assert [s.start_s for s in w.sessions] == pytest.approx([r["timestamp"] / 4000.0 for r in rows])


def test_mooncake_spread_buckets() -> None:
    plain = load_workload(MOONCAKE, max_requests=2000)
    a = load_workload(MOONCAKE, max_requests=2000, spread_buckets=True, seed=1)
    b = load_workload(MOONCAKE, max_requests=2000, spread_buckets=True, seed=1)
    c = load_workload(MOONCAKE, max_requests=2000, spread_buckets=True, seed=2)
    sa = [s.start_s for s in a.sessions]
    assert sa == [s.start_s for s in b.sessions]
    assert sa != [s.start_s for s in c.sessions]
    assert len(set(sa)) == len(sa)  # no two requests share a time any more
    # each request stays inside its ~3 s bucket, and order within the trace is kept
    by_id = {s.session_id: s.start_s for s in a.sessions}
    for p in plain.sessions:
        t = by_id[p.session_id]
        assert p.start_s is not None and t is not None
        assert p.start_s <= t < p.start_s + 3.01
    assert sa == sorted(t for t in sa if t is not None)  # in order, and no start missing


def test_azure_real_file() -> None:
    w = load_workload(require_file(AZURE))
    with AZURE.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(w.sessions) == 19_366
    t0 = datetime.fromisoformat(rows[0]["TIMESTAMP"])
    for row, s in zip(rows, w.sessions, strict=True):
        assert s.turns[0].new_tokens == int(row["ContextTokens"])
        assert s.turns[0].output_tokens == int(row["GeneratedTokens"])
        t = (datetime.fromisoformat(row["TIMESTAMP"]) - t0).total_seconds()
        assert s.start_s == pytest.approx(t, abs=1e-5)
    assert w.sessions[-1].start_s == pytest.approx(3501.72, abs=0.01)
    # no prefix information: every request is unique content
    assert len({s.turns[0].new_segments[0].content_id for s in w.sessions}) == 19_366
    fast = load_workload(AZURE, trace_format="azure", rate_scale=2.0, max_requests=10)
    assert [s.start_s for s in fast.sessions] == pytest.approx(
        [(s.start_s or 0.0) / 2.0 for s in w.sessions[:10]]
    )


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'


@pytest.mark.parametrize(
    ("line3", "field"),
    [
        ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]', None),
        ('{"timestamp": 0, "input_length": 600, "output_length": 5}', "hash_ids"),
        ('{"timestamp": 0, "input_length": "600", "output_length": 5, "hash_ids": [0, 1]}',
         "input_length"),
        ('{"timestamp": 0, "input_length": 600, "output_length": -1, "hash_ids": [0, 1]}',
         "output_length"),
        ('{"timestamp": -5, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]}',
         "timestamp"),
        ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0, "x"]}',
         "hash_ids"),
        ("[1, 2, 3]", None),
    ],
)  # fmt: skip
def test_mooncake_malformed_rows_name_line_and_field(
    tmp_path: Path, line3: str, field: str | None
) -> None:
    p = _write(tmp_path, "t.jsonl", GOOD + "\n" + line3 + "\n" + GOOD)
    with pytest.raises(TraceFormatError) as info:
        load_workload(p)
    assert info.value.line == 3
    assert "line 3" in str(info.value) and str(p) in str(info.value)
    if field is not None:
        assert info.value.field == field and repr(field) in str(info.value)


def test_mooncake_small_file_edge_cases(tmp_path: Path) -> None:
    text = (
        '{"timestamp": 3000, "input_length": 1024, "output_length": 0, "hash_ids": [7, 8]}\n'
        '{"timestamp": 0, "input_length": 700, "output_length": 2, "hash_ids": [7]}\n'
        '{"timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [7, 9, 10]}\n'
    )
    w = load_workload(_write(tmp_path, "small.trace", text))  # detected from content
    assert w.meta["length_mismatch_rows"] == 2 and w.meta["zero_output_rows"] == 1
    # sorted by arrival (stable): rows 2, 3, 1
    assert [s.session_id for s in w.sessions] == ["mooncake/1", "mooncake/2", "mooncake/0"]
    r1, r2, r0 = (s.turns[0] for s in w.sessions)
    assert r0.output_tokens == 1
    assert r0.new_segments == [Segment(block_content_id(7), 512), Segment(block_content_id(8), 512)]
    # fewer ids than blocks: the rest is one unique tail segment
    assert r1.new_segments[0] == Segment(block_content_id(7), 512) and r1.new_tokens == 700
    assert r1.new_segments[1].num_tokens == 188
    # more ids than blocks: surplus dropped, the only block is partial
    assert r2.new_segments == [Segment(block_content_id(7), 100)]
    with pytest.raises(TraceFormatError, match="no requests"):
        load_workload(_write(tmp_path, "empty.jsonl", "\n\n"))


def test_azure_malformed(tmp_path: Path) -> None:
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    ok = "2023-11-16 18:15:46.6805900,374,44\n"
    cases = [
        ("2023-13-99 18:15:46.68,374,44\n", "TIMESTAMP"),
        ("2023-11-16 18:15:47.0,abc,44\n", "ContextTokens"),
        ("2023-11-16 18:15:47.0,0,44\n", "ContextTokens"),
        ("2023-11-16 18:15:47.0,12\n", "GeneratedTokens"),
    ]
    for bad, field in cases:
        p = _write(tmp_path, "a.csv", head + ok + bad)
        with pytest.raises(TraceFormatError) as info:
            load_workload(p)
        assert info.value.line == 3 and info.value.field == field, str(info.value)
    with pytest.raises(TraceFormatError, match="header") as info2:
        load_workload(_write(tmp_path, "b.csv", "time,in,out\n" + ok))
    assert info2.value.line == 1
    w = load_workload(_write(tmp_path, "c.csv", head + "10.5,5,0\n\n12.0,6,3\n"))  # seconds ok
    assert [s.start_s for s in w.sessions] == [0.0, 1.5]
    assert w.sessions[0].turns[0].output_tokens == 1


def test_format_detection(tmp_path: Path) -> None:
    assert detect_trace_format(_write(tmp_path, "x.jsonl", GOOD)) == "mooncake"
    assert detect_trace_format(_write(tmp_path, "x.csv", "anything")) == "azure"
    assert (
        detect_trace_format(_write(tmp_path, "x.txt", "TIMESTAMP,ContextTokens,GeneratedTokens\n"))
        == "azure"
    )
    with pytest.raises(TraceFormatError, match="cannot tell"):
        detect_trace_format(_write(tmp_path, "x.dat", "hello\n"))
    with pytest.raises(ValueError, match="unknown trace format"):
        load_workload(_write(tmp_path, "y.jsonl", GOOD), trace_format="parquet")
    with pytest.raises(FileNotFoundError):
        load_workload(tmp_path / "missing.jsonl", trace_format="mooncake")


# -- overlay: rate scaling that keeps the trace's clock ------------------------------------------
def test_overlay_keeps_the_per_minute_shape_and_the_length() -> None:
    from benchmarks.workloads.load_profile import load_profile
    from benchmarks.workloads.overlay import overlay

    azure = load_workload(require_file(AZURE), trace_format="azure")
    base = load_profile(azure)
    for k in (3.0, 2.5):
        ov = overlay(azure, k, seed=1)
        prof = load_profile(ov)
        assert abs(ov.num_requests - k * azure.num_requests) < 0.02 * k * azure.num_requests
        assert len(prof.requests) == len(base.requests)  # same length: an hour stays an hour
        assert abs(prof.prefill_peak_mean_ratio - base.prefill_peak_mean_ratio) < 0.05
        # every minute carries ~k times the original minute's load
        for b, o in zip(base.prefill_tokens[:-1], prof.prefill_tokens[:-1], strict=True):
            assert abs(o / b - k) < 0.25 * k
    # compressing instead flattens the per-minute peaks (16 real minutes per bin)
    squeezed = load_profile(load_workload(require_file(AZURE), trace_format="azure", rate_scale=8))
    assert squeezed.prefill_peak_mean_ratio < base.prefill_peak_mean_ratio - 0.2


def test_overlay_copies_have_own_ids_and_keep_their_own_prefix_sharing() -> None:
    from benchmarks.workloads.overlay import overlay

    wl = load_workload(require_file(MOONCAKE), max_requests=200)
    ov = overlay(wl, 2.0, seed=0, jitter_s=0.5)
    assert ov.num_requests == 400
    assert len({s.session_id for s in ov.sessions}) == 400
    orig = {s.session_id: s for s in wl.sessions}
    copy = {s.session_id: s for s in ov.sessions if s.session_id.endswith("#1")}
    assert len(copy) == 200
    ids0 = {seg.content_id for s in wl.sessions for seg in s.turns[0].new_segments}
    ids1 = {seg.content_id for s in copy.values() for seg in s.turns[0].new_segments}
    assert not ids0 & ids1  # no copy hits another copy's cache
    assert len(ids0) == len(ids1)  # ... but shares within itself exactly as the trace does
    for sid, s in copy.items():
        o = orig[sid.removesuffix("#1")]
        assert o.start_s is not None and s.start_s is not None
        assert abs(s.start_s - o.start_s) <= 0.5 + 1e-9
        assert [x.num_tokens for x in s.turns[0].new_segments] == [
            x.num_tokens for x in o.turns[0].new_segments
        ]
    assert overlay(wl, 2.0, seed=0).sessions[5].start_s == ov.sessions[5].start_s  # seeded
    with pytest.raises(ValueError, match="overlay factor"):
        overlay(wl, 0.0)
