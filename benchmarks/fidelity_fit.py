"""The fidelity benchmark's fit: the `cpu` profile's constants from a vLLM run by least squares
over a virtual-time replay of the same workload through the engine core (`benchmarks/fidelity.py`
docstring, "Fit")."""

from __future__ import annotations

import dataclasses
import inspect
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.fidelity_measure import (
    BLOCK_SIZE,
    CONCURRENCY,
    MAX_MODEL_LEN,
    MAX_TOKENS,
    PROMPT_LENGTHS,
    RequestTiming,
    ServerMeans,
    pct,
)
from benchmarks.nnls import nnls_exact
from pools.sim.config import EngineConfig
from pools.sim.driver import EngineDriver
from pools.sim.engine_core import EngineCore, StepResult
from pools.sim.kv_events import KVCacheEvent
from pools.sim.profiles import GpuProfile, get_gpu, get_model
from pools.sim.request import SimRequest
from pools.sim.timing import TimingModel

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


# `TimingModel.step_time`'s parameters: a call's arguments recorded however it passes them
_STEP_TIME = inspect.signature(TimingModel.step_time)


class _RecordingTiming(TimingModel):
    """The `cpu` timing model with `constants`, recording the arguments of every `step_time`
    call (a benchmark instrument: the step times are the model's own, only observed)."""

    def __init__(
        self, constants: dict[str, float], log: list[tuple[int, int, float, int, int]]
    ) -> None:
        super().__init__(get_model("tiny"), _cpu_gpu(constants))
        self._log = log

    def step_time(self, *args: Any, **kwargs: Any) -> float:
        call = _STEP_TIME.bind(self, *args, **kwargs)
        call.apply_defaults()
        _, num_tokens, num_seqs, attn_ctx_tokens, kv_read_tokens, num_new_seqs = (
            call.arguments.values()
        )
        self._log.append((num_tokens, num_seqs, attn_ctx_tokens, kv_read_tokens, num_new_seqs))
        return super().step_time(*args, **kwargs)


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
    log: list[tuple[int, int, float, int, int]] = []
    core = EngineCore(
        EngineConfig.model_validate(
            {"block_size": BLOCK_SIZE, "max_model_len": MAX_MODEL_LEN, "vocab_size": 4096}
        ),
        _RecordingTiming(constants, log),
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


def _cpu_gpu(constants: dict[str, float]) -> GpuProfile:
    """The `cpu` GPU profile with `constants` (missing overheads = 0)."""
    return dataclasses.replace(
        get_gpu("cpu"),
        mfu=constants["mfu"],
        step_overhead_s=constants.get("step_overhead_s", 0.0),
        per_seq_overhead_s=constants.get("per_seq_overhead_s", 0.0),
        per_token_overhead_s=constants.get("per_token_overhead_s", 0.0),
        per_new_seq_overhead_s=constants.get("per_new_seq_overhead_s", 0.0),
    )


def _cpu_timing(constants: dict[str, float]) -> TimingModel:
    return TimingModel(get_model("tiny"), _cpu_gpu(constants))


def profile_constants() -> dict[str, float]:
    """The `cpu` profile's fitted constants as they are in `pools/sim/profiles.py`."""
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
            x[free], sse = nnls_exact(design[:, free] * scale[:, None], (y - base) * scale)
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
