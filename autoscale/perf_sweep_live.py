"""The live half of the performance sweep: measure a running engine over OpenAI streams.

What is measured and how is described in `autoscale/perf_sweep.py`'s module docstring; this
module holds the client: `probe_engine` (served model, model length, KV pool from `/metrics`)
and `measure_live` (the prefill and decode points).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autoscale.perf_sweep import DEFAULT_DECODE_TOKENS, DEFAULT_REPEATS
from pools.http_client import client_limits, http_client

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


async def stream_token_stamps(
    client: Any,
    url: str,
    model: str,
    prompt: list[int],
    max_tokens: int,
    stop: Callable[[Stamps], bool] | None = None,
) -> Stamps:
    """One streamed completion's token stamps; `stop(stamps)` true after a chunk closes it.

    Greedy, `ignore_eos`, with `continuous_usage_stats` so that every chunk carries the
    completion's token count (a chunk holding several tokens counts them all). Also the
    client of `benchmarks/fidelity.py`. Raises RuntimeError when no token chunk came.
    """
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

    async with http_client(timeout=httpx.Timeout(60.0)) as client:
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
    limits = client_limits(max_connections=max([1, *(b for b, _ in points)]) + 4)
    async with http_client(timeout=httpx.Timeout(600.0), limits=limits) as client:
        await stream_token_stamps(client, url, model, prompt(64), 4)  # warm-up
        for n in isl_tokens:
            if progress:
                progress(f"prefill {n} tokens")
            before = await _engine_sums(client, url)
            ttfts = []
            for _ in range(repeats):
                start = time.perf_counter()
                stamps = await stream_token_stamps(client, url, model, prompt(n), 1)
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
                *(
                    stream_token_stamps(client, url, model, prompt(c), cap, window.stop(i))
                    for i in range(b)
                )
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
