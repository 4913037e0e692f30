"""`pdorch dev tiny-model DIR`: build the tiny random-weight Llama used by CPU tests and demos."""

from __future__ import annotations

from pathlib import Path

import typer


def tiny_model(
    out_dir: Path = typer.Argument(
        ...,
        help="Directory to write the model into (created if missing; files are overwritten).",
        file_okay=False,
    ),
    seed: int = typer.Option(
        0, "--seed", min=0, help="Seed of the random weights: the same seed gives identical files."
    ),
) -> None:
    """Build a tiny Llama (random bf16 weights + a BPE tokenizer with a chat template), offline.

    vLLM serves it like any Hugging Face checkpoint (`pdorch engine vllm --model DIR`), so the
    real-engine path runs on machines that cannot download a model. Its output is noise: it is
    for exercising engines, not for reading.
    """
    from rich.console import Console

    from pools.tiny_model import TinyModelSpec, build_tiny_model

    console = Console(stderr=True)
    with console.status(f"building tiny model (seed {seed}) in {out_dir} ..."):
        files = build_tiny_model(out_dir, TinyModelSpec(seed=seed))
    for path in files:
        console.print(f"  {path.name:<24} {path.stat().st_size:>10,} bytes")
    console.print(f"[green]tiny model ready:[/green] {out_dir}")
