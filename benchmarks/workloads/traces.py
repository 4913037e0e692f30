"""Trace replay: Mooncake JSONL and Azure LLM-inference CSV files as workloads.

Every trace row becomes one single-turn session with `carry_context=False` (the row already
holds the whole prompt), arriving at the row's timestamp divided by `rate_scale`.

**Mooncake** (`kvcache-ai/Mooncake` FAST'25 release and files of the same schema): JSON Lines
with `timestamp` (ms, relative), `input_length`, `output_length`, `hash_ids` (ids of the
prompt's `block_tokens`-token blocks, 512 in Mooncake). Block i becomes
`Segment(block_content_id(hash_ids[i]), 512)` and the last block
`Segment(block_content_id(hash_ids[-1]), input_length - 512·(n-1))`, so equal ids give equal
segments and a partial last block renders as a prefix of the full block (see `text.py`). Rows
whose id count disagrees with `ceil(input_length / block_tokens)` are still loaded: missing
blocks become one unique tail segment, surplus ids are dropped; `meta["length_mismatch_rows"]`
counts them. Mooncake timestamps are quantized to ~3 s buckets; `spread_buckets=True` spreads
the requests of each bucket uniformly (seeded, order kept) over the gap to the next distinct
timestamp (the last bucket uses the median gap).

**Azure** (`Azure/AzurePublicDataset` 2023/2024 schema): CSV with header
`TIMESTAMP,ContextTokens,GeneratedTokens`; `TIMESTAMP` is `YYYY-MM-DD HH:MM:SS.fffffff` (or
plain seconds). No prefix information, so each request's prompt is unique content.

Parsing is strict and fast: msgspec decodes the whole JSONL file in one call (falling back to
line-by-line decoding only to locate an error); csv for Azure. Malformed input raises
`TraceFormatError` naming the file, the 1-based line number and the field. An output length of
0 is replayed as 1 token (OpenAI servers reject `max_tokens=0`); `meta["zero_output_rows"]`
counts them.

Load time (CPU time, `time.process_time`, dev machine): the 12,031-row Mooncake conversation
trace in 0.22-0.25 s, the 19,366-row Azure conversation trace in 0.11-0.12 s.
"""

from __future__ import annotations

import csv
import gc
import io
import itertools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np

from benchmarks.workloads.model import Segment, SessionSpec, TurnSpec, Workload, content_id_for

__all__ = [
    "AZURE_CONVERSATION",
    "MOONCAKE_CONVERSATION",
    "TRACES_DIR",
    "TRACE_FORMATS",
    "TraceFormatError",
    "block_content_id",
    "detect_trace_format",
    "load_azure",
    "load_mooncake",
    "load_trace",
]

TRACE_FORMATS = ("mooncake", "azure")

# The repository's copies of the public traces (`benchmarks/traces/`: upstream bytes, licences,
# SHA256SUMS). Repository data, not package data: an installed wheel does not ship them.
TRACES_DIR = Path(__file__).resolve().parents[1] / "traces"
MOONCAKE_CONVERSATION = TRACES_DIR / "mooncake" / "conversation_trace.jsonl"
AZURE_CONVERSATION = TRACES_DIR / "azure" / "AzureLLMInferenceTrace_conv.csv"

_MASK63 = (1 << 63) - 1
_PHI = 0x9E3779B97F4A7C15
_BLOCK_NS = content_id_for("trace-block")


class TraceFormatError(ValueError):
    """A trace file that does not follow its format: says where (line, field) and why."""

    def __init__(self, path: Path, line: int | None, field: str | None, message: str) -> None:
        where = str(path)
        if line is not None:
            where += f", line {line}"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.field = field


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building many small acyclic objects.

    A trace load allocates ~200k segments; without this, repeated full collections over the
    growing heap take more time than the parsing itself (measured: ~2.5x slower load).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def block_content_id(hash_id: int) -> int:
    """Content id of a trace block id (same id in any trace file → same content)."""
    return ((hash_id * _PHI) ^ _BLOCK_NS) & _MASK63


def detect_trace_format(path: Path) -> str:
    """`mooncake` or `azure` from the extension, else from the first non-blank line."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "mooncake"
    if suffix == ".csv":
        return "azure"
    with path.open("rb") as f:
        for raw in f:
            line = raw.strip()
            if not line:
                continue
            if line.startswith(b"{"):
                return "mooncake"
            if b"timestamp" in line.lower() and b"contexttokens" in line.lower():
                return "azure"
            break
    raise TraceFormatError(
        path, None, None, f"cannot tell the trace format; pass one of {', '.join(TRACE_FORMATS)}"
    )


def load_trace(
    path: str | Path,
    *,
    trace_format: str | None = None,
    rate_scale: float = 1.0,
    seed: int = 0,
    **kw: Any,
) -> Workload:
    """Load a trace file as a workload (format given or auto-detected)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trace file not found: {p}")
    if rate_scale <= 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    fmt = trace_format or detect_trace_format(p)
    if fmt == "mooncake":
        with gc_paused():
            return load_mooncake(p, rate_scale=rate_scale, seed=seed, **kw)
    if fmt == "azure":
        with gc_paused():
            return load_azure(p, rate_scale=rate_scale, **kw)
    raise ValueError(f"unknown trace format {fmt!r}; known: {', '.join(TRACE_FORMATS)}")


# ---------------------------------------------------------------------------------------------
# Mooncake


_NonNeg = Annotated[int, msgspec.Meta(ge=0)]


class _MooncakeRow(msgspec.Struct):
    timestamp: Annotated[float, msgspec.Meta(ge=0)]
    input_length: Annotated[int, msgspec.Meta(ge=1)]
    output_length: _NonNeg
    hash_ids: list[_NonNeg]


_ROWS_DECODER = msgspec.json.Decoder(list[_MooncakeRow])
_ROW_DECODER = msgspec.json.Decoder(_MooncakeRow)
_FIELD_RE = re.compile(r"`\$(?:\[\d+\])?\.(\w+)|field `(\w+)`")


def _mooncake_error(path: Path, line: int, err: Exception) -> TraceFormatError:
    msg = str(err)
    if isinstance(err, msgspec.DecodeError) and not isinstance(err, msgspec.ValidationError):
        msg = f"invalid JSON: {msg}"
    m = _FIELD_RE.search(msg)
    field = (m.group(1) or m.group(2)) if m else None
    return TraceFormatError(path, line, field, msg)


def _decode_mooncake(
    path: Path, data: bytes, max_requests: int | None
) -> tuple[list[Any], list[int]]:
    lines: list[bytes] = []
    line_nos: list[int] = []
    for no, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            lines.append(raw)
            line_nos.append(no)
            if max_requests is not None and len(lines) >= max_requests:
                break
    try:
        rows: list[Any] = _ROWS_DECODER.decode(b"[" + b",".join(lines) + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError):
        for raw, no in zip(lines, line_nos, strict=True):
            try:
                _ROW_DECODER.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as err:
                raise _mooncake_error(path, no, err) from None
        raise  # the joined buffer failed but no single line did: not expected
    return rows, line_nos


def load_mooncake(
    path: Path,
    *,
    rate_scale: float = 1.0,
    seed: int = 0,
    block_tokens: int = 512,
    spread_buckets: bool = False,
    max_requests: int | None = None,
) -> Workload:
    """Load a Mooncake-format JSONL trace (see the module docstring)."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    rows, line_nos = _decode_mooncake(path, path.read_bytes(), max_requests)
    if not rows:
        raise TraceFormatError(path, None, None, "no requests in the file")

    times_ms = [float(r.timestamp) for r in rows]
    if spread_buckets:
        times_ms = _spread_buckets(times_ms, seed)
    full_blocks: dict[int, Segment] = {}
    cached = full_blocks.get

    def full_block(h: int) -> Segment:
        seg = full_blocks[h] = Segment(block_content_id(h), block_tokens)
        return seg

    mismatched = 0
    zero_out = 0
    sessions: list[SessionSpec] = []
    for i, r in enumerate(rows):
        n_in = r.input_length
        ids = r.hash_ids
        n_blocks = -(-n_in // block_tokens)
        if len(ids) != n_blocks:
            mismatched += 1
            ids = ids[:n_blocks]
        if not ids:
            segs = []
            covered = 0
        else:
            # Dataclass truthiness is always True, so `or` only builds missing blocks.
            segs = [cached(h) or full_block(h) for h in ids[:-1]]
            covered = block_tokens * (len(ids) - 1)
            rest = min(n_in - covered, block_tokens)
            h = ids[-1]
            segs.append(
                (cached(h) or full_block(h))
                if rest == block_tokens
                else Segment(block_content_id(h), rest)
            )
            covered += rest
        if covered < n_in:
            tail = content_id_for("trace-tail", path.name, line_nos[i])
            segs.append(Segment(tail, n_in - covered))
        out = r.output_length
        if out == 0:
            zero_out += 1
            out = 1
        sessions.append(
            SessionSpec(
                f"mooncake/{i}",
                times_ms[i] / 1000.0 / rate_scale,
                [TurnSpec(segs, out)],
                carry_context=False,
            )
        )
    _sort_by_start(sessions)
    return Workload(
        name=f"trace:{path.name}",
        sessions=sessions,
        concurrency=None,
        meta={
            "trace": str(path),
            "trace_format": "mooncake",
            "rate_scale": rate_scale,
            "block_tokens": block_tokens,
            "spread_buckets": spread_buckets,
            "seed": seed,
            "length_mismatch_rows": mismatched,
            "zero_output_rows": zero_out,
        },
    )


def _spread_buckets(times_ms: list[float], seed: int) -> list[float]:
    """Spread requests sharing one timestamp uniformly over the gap to the next timestamp."""
    distinct = sorted(set(times_ms))
    if len(distinct) < 2:
        return times_ms
    gaps = {a: b - a for a, b in itertools.pairwise(distinct)}
    gaps[distinct[-1]] = float(np.median(np.diff(distinct)))
    rng = np.random.default_rng([seed, 0x5350])
    members: dict[float, list[int]] = {}
    for i, t in enumerate(times_ms):
        members.setdefault(t, []).append(i)
    out = list(times_ms)
    for t in distinct:
        idx = members[t]
        offsets = np.sort(rng.uniform(0.0, gaps[t], len(idx)))
        for i, off in zip(idx, offsets, strict=True):
            out[i] = t + float(off)
    return out


def _sort_by_start(sessions: list[SessionSpec]) -> None:
    starts = [s.start_s for s in sessions]
    if any(a is not None and b is not None and b < a for a, b in itertools.pairwise(starts)):
        sessions.sort(key=lambda s: s.start_s if s.start_s is not None else 0.0)


# ---------------------------------------------------------------------------------------------
# Azure

_AZURE_COLUMNS = ("timestamp", "contexttokens", "generatedtokens")


def _parse_azure_time(path: Path, line: int, text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise TraceFormatError(
            path,
            line,
            "TIMESTAMP",
            f"expected 'YYYY-MM-DD HH:MM:SS.fffffff' or seconds, got {text!r}",
        ) from None


def _parse_azure_int(path: Path, line: int, field: str, text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise TraceFormatError(path, line, field, f"expected an integer, got {text!r}") from None
    if value < minimum:
        raise TraceFormatError(path, line, field, f"expected >= {minimum}, got {value}")
    return value


def load_azure(path: Path, *, rate_scale: float = 1.0, max_requests: int | None = None) -> Workload:
    """Load an Azure LLM-inference-trace CSV (see the module docstring)."""
    text = path.read_text(encoding="utf-8-sig")
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise TraceFormatError(path, 1, None, "empty file (expected a header)")
    names = [h.strip() for h in header]
    lowered = [h.lower() for h in names]
    try:
        cols = [lowered.index(c) for c in _AZURE_COLUMNS]
    except ValueError:
        raise TraceFormatError(
            path, 1, None, f"header must name TIMESTAMP,ContextTokens,GeneratedTokens, got {names}"
        ) from None
    field_names = [names[c] for c in cols]
    width = max(cols) + 1
    times: list[float] = []
    lengths: list[tuple[int, int, int]] = []
    for row in reader:
        line = reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < width:
            missing = field_names[[c >= len(row) for c in cols].index(True)]
            raise TraceFormatError(path, line, missing, f"row has {len(row)} columns")
        times.append(_parse_azure_time(path, line, row[cols[0]]))
        ctx = _parse_azure_int(path, line, field_names[1], row[cols[1]], 1)
        gen = _parse_azure_int(path, line, field_names[2], row[cols[2]], 0)
        lengths.append((ctx, gen, line))
        if max_requests is not None and len(lengths) >= max_requests:
            break
    if not lengths:
        raise TraceFormatError(path, None, None, "no requests in the file")
    t0 = min(times)
    sessions: list[SessionSpec] = []
    zero_out = 0
    for i, ((ctx, gen, line), t) in enumerate(zip(lengths, times, strict=True)):
        if gen == 0:
            zero_out += 1
            gen = 1
        seg = Segment(content_id_for("azure", path.name, line), ctx)
        sessions.append(
            SessionSpec(
                f"azure/{i}", (t - t0) / rate_scale, [TurnSpec([seg], gen)], carry_context=False
            )
        )
    _sort_by_start(sessions)
    span = max(times) - t0
    return Workload(
        name=f"trace:{path.name}",
        sessions=sessions,
        concurrency=None,
        meta={
            "trace": str(path),
            "trace_format": "azure",
            "rate_scale": rate_scale,
            "span_s": span,
            "zero_output_rows": zero_out,
        },
    )
