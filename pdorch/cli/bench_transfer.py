"""`pdorch` command placeholder: owned by the engineer building it (see docs/CONVENTIONS.md)."""

from __future__ import annotations

import typer


def bench_transfer() -> None:
    """Not built yet."""
    raise typer.Exit(code=2)
