"""`pdorch dev tiny-model --out DIR`: the tiny random-weight Llama of the CPU tests and demos."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand


class PositionalDirIsOut(TyperCommand):
    """Accepts the old `pdorch dev tiny-model DIR` as `--out DIR` for one release (with a warning
    on stderr): the output path is `--out` on every command now."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        # ctx: Any because typer's click Context is private (typer vendors click).
        rewritten: list[str] = []
        takes_value = {"--out", "--seed"}
        for i, arg in enumerate(args):
            after_flag = i > 0 and args[i - 1] in takes_value
            if not arg.startswith("-") and not after_flag:
                print(
                    f"{ctx.command_path}: DIR as an argument is deprecated (one more "
                    "release); use --out DIR",
                    file=sys.stderr,
                )
                rewritten.append("--out")
            rewritten.append(arg)
        return super().parse_args(ctx, rewritten)


def tiny_model(
    out: Path = typer.Option(
        ...,
        "--out",
        help="Directory to write the model into (created if missing; files are overwritten).",
        file_okay=False,
    ),
    seed: int = typer.Option(
        0, "--seed", min=0, help="Seed of the random weights: the same seed gives identical files."
    ),
) -> None:
    """Build a tiny Llama (random bf16 weights + a BPE tokenizer with a chat template), offline.

    vLLM serves it like any Hugging Face checkpoint (`pdorch engine vllm --model-dir DIR`), so
    the real-engine path runs on machines that cannot download a model. Its output is noise: it
    is for exercising engines, not for reading.

    Example: `pdorch dev tiny-model --out .cache/tiny-model --seed 0`
    """
    from rich.console import Console

    from pools.tiny_model import TinyModelSpec, build_tiny_model

    out_dir = out
    console = Console(stderr=True)
    with console.status(f"building tiny model (seed {seed}) in {out_dir} ..."):
        files = build_tiny_model(out_dir, TinyModelSpec(seed=seed))
    for path in files:
        console.print(f"  {path.name:<24} {path.stat().st_size:>10,} bytes")
    console.print(f"[green]tiny model ready:[/green] {out_dir}")
