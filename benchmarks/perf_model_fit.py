"""Fit the timing model's GPU-profile constants to a measured sweep, and state the fit error.

`compare` (`autoscale/perf_sweep.py`) states how far the *shipped* profile is from a live
engine. This module answers the other question the performance model raises: how well can the
timing model's formula (`pools/sim/timing.py`: a roofline plus per-step, per-sequence,
per-token and per-request overheads) describe that engine once its constants are fitted to
the sweep? The fitted constants are what `gpu` profile a planner should use on that hardware;
the residuals are the fit error.

Fit: the sweep's points are `prefill_time(n)` (one request, `max_tokens` 1) and
`decode_time(b, b·ctx)` at the window's mean context (as `compare` evaluates them). Each is
`step_time` of a step whose duration is `roofline(T, S, A, R; mfu) + step·1 + per_seq·S +
per_token·T + per_new_seq·N`: linear in the four overheads once `mfu` is fixed. So, for every
`mfu` on a grid (0.05 .. 1.00), the overheads solve a non-negative least-squares problem on
the relative residuals `(model - measured) / measured` (a 5 ms and a 500 ms point weigh
alike); the `mfu` with the smallest sum of squares wins. Parameters: `source` "client" fits
the client-side figures (what a planner's SLO sees), "engine" the engine's own histogram means
where the sweep has them (prefill only; decode stays client-side, see `perf_sweep.py`).

Errors reported per point and as median / max of the absolute relative error, for prefill
tokens/s (`n / time`: error = measured_time / model_time - 1) and decode step time
(error = model / measured - 1).

Run: `python -m benchmarks.perf_model_fit SWEEP.json [--source client|engine] [--json]
[--against OTHER.json]` (`--against`: the fit's errors on another sweep, e.g. a repeat).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from typing import Any

import numpy as np

from autoscale.perf_sweep import Sweep
from benchmarks.nnls import nnls_exact
from pools.sim.profiles import GpuProfile, get_gpu, get_model
from pools.sim.timing import TimingModel

OVERHEADS = (
    "step_overhead_s",
    "per_seq_overhead_s",
    "per_token_overhead_s",
    "per_new_seq_overhead_s",
)
MFU_GRID = tuple(round(0.05 + 0.01 * i, 2) for i in range(96))


def gpu_with(gpu: str, constants: dict[str, float]) -> GpuProfile:
    """GPU profile `gpu` with `constants` (`mfu` and any of `OVERHEADS`) replaced."""
    base = get_gpu(gpu)
    return dataclasses.replace(
        base,
        mfu=constants.get("mfu", base.mfu),
        step_overhead_s=constants.get("step_overhead_s", base.step_overhead_s),
        per_seq_overhead_s=constants.get("per_seq_overhead_s", base.per_seq_overhead_s),
        per_token_overhead_s=constants.get("per_token_overhead_s", base.per_token_overhead_s),
        per_new_seq_overhead_s=constants.get("per_new_seq_overhead_s", base.per_new_seq_overhead_s),
    )


def timing_with(sweep: Sweep, constants: dict[str, float]) -> TimingModel:
    """The sweep's model x GPU profile with `constants` (mfu and the overheads) replaced."""
    return TimingModel(get_model(sweep.model_profile), gpu_with(sweep.gpu, constants), tp=sweep.tp)


def _points(sweep: Sweep, source: str) -> list[tuple[str, tuple[int, int], float]]:
    """(kind, key, measured seconds) per point; decode keys carry the evaluated context."""
    out: list[tuple[str, tuple[int, int], float]] = []
    for n, t in sorted(sweep.prefill.items()):
        measured = sweep.engine_prefill.get(n, t) if source == "engine" else t
        out.append(("prefill", (n, 0), measured))
    for (b, c), t in sorted(sweep.decode.items()):
        ctx = c + round(sweep.decode_positions.get((b, c), sweep.decode_tokens / 2))
        out.append(("decode", (b, ctx), t))
    return out


def _predict(timing: TimingModel, kind: str, key: tuple[int, int]) -> float:
    n_or_b, ctx = key
    return (
        timing.prefill_time(n_or_b)
        if kind == "prefill"
        else timing.decode_time(n_or_b, n_or_b * ctx)
    )


def fit_sweep(sweep: Sweep, source: str = "client") -> dict[str, Any]:
    """Fitted constants, per-point errors and their summary (module docstring)."""
    points = _points(sweep, source)
    y = np.array([t for _, _, t in points])
    scale = 1.0 / y
    # each overhead's column: the step's (1, S, T, N) summed over the point's steps; a unit
    # overhead's contribution is measured by the model itself with only that overhead set
    zero = dict.fromkeys(OVERHEADS, 0.0)
    best: tuple[float, float, np.ndarray] | None = None
    for mfu in MFU_GRID:
        roof_model = timing_with(sweep, {"mfu": mfu, **zero})
        base = np.array([_predict(roof_model, k, key) for k, key, _ in points])
        cols = []
        for name in OVERHEADS:
            unit = timing_with(sweep, {"mfu": mfu, **zero, name: 1.0})
            cols.append([_predict(unit, k, key) for k, key, _ in points])
        design = np.array(cols).T - base[:, None]
        x, sse = nnls_exact(design * scale[:, None], (y - base) * scale)
        if best is None or sse < best[0]:
            best = (sse, mfu, x)
    assert best is not None
    constants = {"mfu": best[1], **dict(zip(OVERHEADS, map(float, best[2]), strict=True))}
    return evaluate(sweep, constants, source)


def evaluate(sweep: Sweep, constants: dict[str, float], source: str = "client") -> dict[str, Any]:
    """Per-point errors and their summary of the timing model with `constants` on `sweep`
    (the fit's own sweep, or another one: a repeat, to see how well the fit carries over)."""
    points = _points(sweep, source)
    fitted = timing_with(sweep, constants)
    prefill, decode = [], []
    for kind, key, measured in points:
        model = _predict(fitted, kind, key)
        if kind == "prefill":
            n = key[0]
            prefill.append(
                {
                    "isl_tokens": n,
                    "measured_s": measured,
                    "model_s": model,
                    "measured_tokens_per_s": n / measured,
                    "model_tokens_per_s": n / model,
                    "error": measured / model - 1.0,
                }
            )
        else:
            b, ctx = key
            decode.append(
                {
                    "batch": b,
                    "model_context_tokens": ctx,
                    "measured_s": measured,
                    "model_s": model,
                    "error": model / measured - 1.0,
                }
            )

    def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
        errors = [abs(r["error"]) for r in rows]
        return {"median_abs_error": statistics.median(errors), "max_abs_error": max(errors)}

    return {
        "source": source,
        "constants": constants,
        "prefill": prefill,
        "decode": decode,
        "summary": {"prefill_tokens_per_s": summary(prefill), "decode_step_s": summary(decode)},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("sweep", help="a sweep file (pdorch profile --sweep --out FILE)")
    parser.add_argument("--source", choices=("client", "engine"), default="client")
    parser.add_argument("--json", action="store_true", help="print the fit as JSON")
    parser.add_argument(
        "--against", default=None, help="evaluate the fit on this other sweep file instead"
    )
    args = parser.parse_args(argv)
    fit = fit_sweep(Sweep.load(args.sweep), args.source)
    if args.against is not None:
        fit = evaluate(Sweep.load(args.against), fit["constants"], args.source)
    if args.json:
        json.dump(fit, sys.stdout, indent=1)
        print()
        return
    print("constants:", {k: f"{v:.3g}" for k, v in fit["constants"].items()})
    for r in fit["prefill"]:
        print(f"prefill {r['isl_tokens']:>6}: {r['measured_s'] * 1e3:8.2f} ms, model "
              f"{r['model_s'] * 1e3:8.2f} ms, tokens/s error {r['error']:+.1%}")  # fmt: skip
    for r in fit["decode"]:
        print(f"decode b={r['batch']:>3} ctx={r['model_context_tokens']:>5}: "
              f"{r['measured_s'] * 1e3:8.2f} ms, model {r['model_s'] * 1e3:8.2f} ms, "
              f"error {r['error']:+.1%}")  # fmt: skip
    for curve, s in fit["summary"].items():
        print(f"{curve}: median |error| {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%}")


if __name__ == "__main__":
    main()
