"""The performance sweep: prefill time over ISL points, decode step time over (batch, context).

Written by `pdorch profile --sweep --out FILE`, read by `SweepPerfModel`. Two sources:

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

import asyncio
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
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


# ---- live measurement -------------------------------------------------------------------------

_SUMS = (
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count",
)
Stamps = list[tuple[float, int]]  # (client clock, completion tokens so far) per token chunk


@dataclass
class LiveEngine:
    """What the live sweep learns of the engine before measuring."""

    served_model_name: str
    kv_capacity_tokens: int | None
    block_size: int | None
    max_model_len: int | None = None


@dataclass
class LiveMeasurement:
    """Seconds per point (client side, engine side) and each decode point's mean output
    position in its window (tokens generated past the prompt)."""

    prefill: dict[int, float]
    decode: dict[tuple[int, int], float]
    engine_prefill: dict[int, float]
    engine_decode: dict[tuple[int, int], float]
    decode_positions: dict[tuple[int, int], float]


async def _stream(
    client: Any,
    url: str,
    model: str,
    prompt: list[int],
    max_tokens: int,
    stop: Callable[[Stamps], bool] | None = None,
) -> Stamps:
    """One streamed completion's token stamps; `stop(stamps)` true after a chunk closes it."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    stamps: Stamps = []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if not chunk.get("choices"):
                continue
            usage = chunk.get("usage") or {}
            count = int(usage.get("completion_tokens", len(stamps) + 1))
            stamps.append((time.perf_counter(), count))
            if stop is not None and stop(stamps):
                break
    if not stamps:
        raise RuntimeError(f"{url}: a stream returned no tokens")
    return stamps


class _Window:
    """The decode point's measuring window (module docstring), shared by its streams."""

    def __init__(self, batch: int, tokens: int) -> None:
        self.batch = batch
        self.tokens = tokens
        self.started = 0
        self.opened_at: float | None = None
        self.done: set[int] = set()

    def stop(self, i: int) -> Callable[[Stamps], bool]:
        def check(stamps: Stamps) -> bool:
            now = stamps[-1][0]
            if len(stamps) == 1:
                self.started += 1
                if self.started == self.batch:
                    self.opened_at = now
            if self.opened_at is not None and i not in self.done:
                inside = [p for p in stamps if p[0] >= self.opened_at]
                if inside and inside[-1][1] - inside[0][1] >= self.tokens:
                    self.done.add(i)
            return len(self.done) == self.batch

        return check

    def itl(self, stamps: Stamps) -> tuple[float, float] | None:
        """(mean gap, mean completion-token position) of a stream inside the window."""
        if self.opened_at is None:
            return None
        inside = [p for p in stamps if p[0] >= self.opened_at]
        if len(inside) < 2 or inside[-1][1] <= inside[0][1]:
            return None
        gap = (inside[-1][0] - inside[0][0]) / (inside[-1][1] - inside[0][1])
        return gap, (inside[0][1] + inside[-1][1]) / 2


async def _engine_sums(client: Any, url: str) -> list[float] | None:
    try:
        text = (await client.get(f"{url}/metrics")).text
    except Exception:  # an engine without /metrics: no engine-side figures
        return None
    values = dict.fromkeys(_SUMS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return [values[k] for k in _SUMS]


def _delta_mean(before: list[float] | None, after: list[float] | None, which: int) -> float | None:
    if before is None or after is None:
        return None
    s, n = after[2 * which] - before[2 * which], after[2 * which + 1] - before[2 * which + 1]
    return s / n if n > 0 else None


async def probe_engine(url: str, served_model_name: str | None) -> LiveEngine:
    """The served model name (`/v1/models` when not given) and the KV pool (`/metrics`)."""
    import httpx

    from pools.metrics_scrape import parse_vllm_metrics

    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as client:
        models = (await client.get(f"{url}/v1/models")).json()["data"]
        card = next((m for m in models if m["id"] == served_model_name), models[0])
        name = served_model_name or str(card["id"])
        max_model_len = card.get("max_model_len")
        blocks = block_size = None
        try:
            metrics = parse_vllm_metrics((await client.get(f"{url}/metrics")).text, 0.0)
            blocks, block_size = metrics.num_gpu_blocks, metrics.block_size
        except (httpx.HTTPError, ValueError):
            pass
    capacity = blocks * block_size if blocks and block_size else None
    return LiveEngine(name, capacity, block_size, max_model_len)


async def measure_live(
    url: str,
    engine: LiveEngine,
    *,
    isl_tokens: Sequence[int],
    points: Sequence[tuple[int, int]],
    decode_tokens: int = DEFAULT_DECODE_TOKENS,
    repeats: int = DEFAULT_REPEATS,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> LiveMeasurement:
    """The sweep's points measured at `url` (module docstring)."""
    import httpx

    rng = random.Random(seed)
    url = url.rstrip("/")
    model = engine.served_model_name

    def prompt(n: int) -> list[int]:
        return [rng.randrange(100, 4000) for _ in range(n)]

    prefill: dict[int, float] = {}
    decode: dict[tuple[int, int], float] = {}
    engine_prefill: dict[int, float] = {}
    engine_decode: dict[tuple[int, int], float] = {}
    positions: dict[tuple[int, int], float] = {}
    max_model_len = engine.max_model_len or 8192
    limits = httpx.Limits(max_connections=max([1, *(b for b, _ in points)]) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        await _stream(client, url, model, prompt(64), 4)  # warm-up
        for n in isl_tokens:
            if progress:
                progress(f"prefill {n} tokens")
            before = await _engine_sums(client, url)
            ttfts = []
            for _ in range(repeats):
                start = time.perf_counter()
                stamps = await _stream(client, url, model, prompt(n), 1)
                ttfts.append(stamps[0][0] - start)
            prefill[n] = statistics.median(ttfts)
            mean = _delta_mean(before, await _engine_sums(client, url), 0)
            if mean is not None:
                engine_prefill[n] = mean
        for b, c in points:
            if progress:
                progress(f"decode batch {b} x {c} tokens")
            before = await _engine_sums(client, url)
            window = _Window(b, decode_tokens)
            cap = max(decode_tokens, min(16384, max_model_len - c - 1))
            streams = await asyncio.gather(
                *(_stream(client, url, model, prompt(c), cap, window.stop(i)) for i in range(b))
            )
            inside = [w for w in (window.itl(s) for s in streams) if w is not None]
            if len(inside) < b:
                raise RuntimeError(
                    f"decode point batch {b} x {c}: {b - len(inside)} streams ended before the "
                    "window (the model length is too short for the ramp)"
                )
            decode[(b, c)] = statistics.median(gap for gap, _ in inside)
            positions[(b, c)] = sum(pos for _, pos in inside) / len(inside)
            mean = _delta_mean(before, await _engine_sums(client, url), 1)
            if mean is not None:
                engine_decode[(b, c)] = mean
    return LiveMeasurement(prefill, decode, engine_prefill, engine_decode, positions)


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
