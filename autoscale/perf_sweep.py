"""The performance sweep: prefill time over ISL points, decode step time over (batch, context).

Written by `pdorch profile --sweep --out FILE`, read by `SweepPerfModel`. Two sources (the
live measurement is `autoscale/perf_sweep_live.py`):

- the timing model (no `--url`): `prefill_time(n)` and `decode_time(b, b*c)` of
  `pools/sim/timing.py` at every point;
- a live engine (`--url`, vLLM or `pdorch engine sim`), measured with real OpenAI
  `/v1/completions` streams of random token-id prompts (a fresh random salt per request, so no
  prefix-cache hits):
  - prefill: for each ISL point, `repeats` requests one at a time with `max_tokens` 1; the
    point's time is the median client-side TTFT (send → first token chunk). At concurrency 1
    that is the prefill plus what the engine adds around it (HTTP, tokenisation, scheduling).
  - decode: for each (batch, context) point, `batch` concurrent streams of `context`-token
    prompts (`ignore_eos`, `max_tokens` up to the model length). The measuring window opens
    when the last stream has its first token (the others' prefills are done, so every step
    from then on decodes exactly `batch` sequences) and closes when every stream has produced
    `decode_tokens` more; then all streams are closed (aborted) together. A stream's ITL is
    its mean token gap inside the window, with `continuous_usage_stats` token counts; the
    point's time is the median over streams. The context grows by the ramp (tokens the early
    streams made while the others prefilled) plus half the window: the compare uses the
    streams' mean position in the window as their context.
  Points whose KV need (`batch · (context + decode_tokens)`) exceeds the KV capacity are
  skipped. The engine's own TTFT/ITL histogram means around each point are kept as
  `engine_s` when its `/metrics` has them (for decode they include the ramp's mixed steps,
  so only the prefill comparison uses them).

`compare(sweep, timing)` puts the timing model's prediction beside every measured point and
reports the relative error `(model - measured) / measured` per point and its mean absolute
value (MAPE) and maximum per curve, against the client-side figure (`error`) and, where the
engine reported one, its own histogram mean (`engine_error`).

JSON (`format: pdorch-perf-sweep/1`): `source`, `url`, `model_profile`, `gpu`, `tp`,
`block_size`, `kv_capacity_tokens`, `max_num_seqs`, `decode_tokens`, `prefill: [{isl_tokens,
time_s, engine_s?}]`, `decode: [{batch, context_tokens, step_s, engine_s?}]`, optional
`compare`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pools.sim.timing import TimingModel

FORMAT = "pdorch-perf-sweep/1"
DEFAULT_ISL_TOKENS = (128, 512, 1024, 2048, 4096, 8192, 16384, 32768)
DEFAULT_BATCHES = (1, 8, 32, 64, 128, 256)
DEFAULT_CONTEXT_TOKENS = (512, 2048, 8192)
DEFAULT_DECODE_TOKENS = 48
DEFAULT_REPEATS = 3


@dataclass
class Sweep:
    """A sweep (see module docstring). `prefill`: ISL → seconds; `decode`: (batch, context) →
    seconds per step; `engine`: the same keys → the engine-side figure, when measured."""

    source: str
    model_profile: str
    gpu: str
    tp: int
    block_size: int
    kv_capacity_tokens: int
    max_num_seqs: int
    prefill: dict[int, float]
    decode: dict[tuple[int, int], float]
    url: str | None = None
    decode_tokens: int = 0
    engine_prefill: dict[int, float] = field(default_factory=dict)
    engine_decode: dict[tuple[int, int], float] = field(default_factory=dict)
    decode_positions: dict[tuple[int, int], float] = field(default_factory=dict)
    compare: dict[str, Any] | None = None

    def decode_columns(self) -> tuple[list[float], list[list[float]], list[list[float]]]:
        """(contexts, batches per context, step times per context), ascending, for
        interpolation. A column holds the batches measured at that context: large contexts
        have fewer (the KV pool caps the batch), so columns may be ragged."""
        contexts = sorted({c for _, c in self.decode})
        batches = [sorted(b for b, cc in self.decode if cc == c) for c in contexts]
        steps = [[self.decode[(b, c)] for b in bs] for c, bs in zip(contexts, batches, strict=True)]
        return [float(c) for c in contexts], [[float(b) for b in bs] for bs in batches], steps

    def to_json(self) -> dict[str, Any]:
        prefill = []
        for n, t in sorted(self.prefill.items()):
            row: dict[str, Any] = {"isl_tokens": n, "time_s": t}
            if n in self.engine_prefill:
                row["engine_s"] = self.engine_prefill[n]
            prefill.append(row)
        decode = []
        for (b, c), t in sorted(self.decode.items()):
            row = {"batch": b, "context_tokens": c, "step_s": t}
            if (b, c) in self.engine_decode:
                row["engine_s"] = self.engine_decode[(b, c)]
            if (b, c) in self.decode_positions:
                row["mean_output_tokens"] = self.decode_positions[(b, c)]
            decode.append(row)
        out: dict[str, Any] = {
            "format": FORMAT,
            "source": self.source,
            "url": self.url,
            "model_profile": self.model_profile,
            "gpu": self.gpu,
            "tp": self.tp,
            "block_size": self.block_size,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "max_num_seqs": self.max_num_seqs,
            "decode_tokens": self.decode_tokens,
            "prefill": prefill,
            "decode": decode,
        }
        if self.compare is not None:
            out["compare"] = self.compare
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sweep:
        if data.get("format") != FORMAT:
            raise ValueError(f"not a sweep file (format {data.get('format')!r}, want {FORMAT!r})")
        prefill = {int(r["isl_tokens"]): float(r["time_s"]) for r in data["prefill"]}
        decode = {
            (int(r["batch"]), int(r["context_tokens"])): float(r["step_s"]) for r in data["decode"]
        }
        if not prefill or not decode:
            raise ValueError("a sweep needs at least one prefill and one decode point")
        return cls(
            source=str(data["source"]),
            url=data.get("url"),
            model_profile=str(data["model_profile"]),
            gpu=str(data["gpu"]),
            tp=int(data["tp"]),
            block_size=int(data["block_size"]),
            kv_capacity_tokens=int(data["kv_capacity_tokens"]),
            max_num_seqs=int(data["max_num_seqs"]),
            decode_tokens=int(data.get("decode_tokens", 0)),
            prefill=prefill,
            decode=decode,
            engine_prefill={
                int(r["isl_tokens"]): float(r["engine_s"])
                for r in data["prefill"]
                if "engine_s" in r
            },
            engine_decode={
                (int(r["batch"]), int(r["context_tokens"])): float(r["engine_s"])
                for r in data["decode"]
                if "engine_s" in r
            },
            decode_positions={
                (int(r["batch"]), int(r["context_tokens"])): float(r["mean_output_tokens"])
                for r in data["decode"]
                if "mean_output_tokens" in r
            },
            compare=data.get("compare"),
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Sweep:
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))


def decode_points(
    batches: Sequence[int], contexts: Sequence[int], kv_capacity_tokens: int, decode_tokens: int
) -> list[tuple[int, int]]:
    """The (batch, context) points whose KV fits the pool (module docstring)."""
    return [
        (b, c) for b in batches for c in contexts if b * (c + decode_tokens) <= kv_capacity_tokens
    ]


def timing_sweep(
    timing: TimingModel,
    *,
    model_profile: str,
    gpu: str,
    isl_tokens: Sequence[int] = DEFAULT_ISL_TOKENS,
    batches: Sequence[int] = DEFAULT_BATCHES,
    context_tokens: Sequence[int] = DEFAULT_CONTEXT_TOKENS,
    block_size: int = 16,
) -> Sweep:
    """The sweep the timing model predicts (no measurement)."""
    points = decode_points(
        [b for b in batches if b <= timing.max_num_seqs],
        context_tokens,
        timing.kv_capacity_tokens,
        0,
    )
    return Sweep(
        source="timing-model",
        model_profile=model_profile,
        gpu=gpu,
        tp=timing.tp,
        block_size=block_size,
        kv_capacity_tokens=timing.kv_capacity_tokens,
        max_num_seqs=timing.max_num_seqs,
        prefill={n: timing.prefill_time(n) for n in isl_tokens},
        decode={(b, c): timing.decode_time(b, b * c) for b, c in points},
    )


def compare(sweep: Sweep, timing: TimingModel) -> dict[str, Any]:
    """The timing model beside every measured point (module docstring)."""

    def rel(model: float, measured: float) -> float:
        return (model - measured) / measured if measured > 0 else float("nan")

    prefill = []
    for n, t in sorted(sweep.prefill.items()):
        model = timing.prefill_time(n)
        row: dict[str, Any] = {"isl_tokens": n, "measured_s": t, "model_s": model}
        row["error"] = rel(model, t)
        if n in sweep.engine_prefill:
            row["engine_error"] = rel(model, sweep.engine_prefill[n])
        prefill.append(row)
    decode = []
    for (b, c), t in sorted(sweep.decode.items()):
        # the measured context grew during the point: compare at the window's mean position
        ctx = c + round(sweep.decode_positions.get((b, c), sweep.decode_tokens / 2))
        model = timing.decode_time(b, b * ctx)
        row = {"batch": b, "context_tokens": c, "measured_s": t, "model_s": model}
        row["model_context_tokens"] = ctx
        row["error"] = rel(model, t)
        decode.append(row)

    def stats(rows: list[dict[str, Any]]) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, prefix in (("error", ""), ("engine_error", "engine_")):
            errors = [abs(r[key]) for r in rows if key in r]
            if errors:
                out[f"{prefix}mape"] = sum(errors) / len(errors)
                out[f"{prefix}max_abs_error"] = max(errors)
        return out

    return {
        "timing_model": {"model_profile": sweep.model_profile, "gpu": sweep.gpu, "tp": sweep.tp},
        "prefill": prefill,
        "decode": decode,
        "summary": {"prefill": stats(prefill), "decode": stats(decode)},
    }
