"""`pdorch bench transfer`: measure KV block transfer on this machine before trusting P/D."""

from __future__ import annotations

import typer

from pdorch.cli.options import split_list


def bench_transfer(
    total_mib: int = typer.Option(
        128,
        "--total-mib",
        min=1,
        help="MiB moved per repetition of each case (block size x pattern x method). Pools "
        "hold 2x this on each side, so expect ~4x in memory per running case.",
    ),
    methods: list[str] = typer.Option(
        ["memcpy,tcp_socket,nixl_shm,nixl_tcp,tcp_mover"],
        "--methods",
        metavar="NAME,...",
        help="Methods, comma-separated or repeated, a subset of: memcpy (in-process ceiling), "
        "tcp_socket (plain socket), nixl_shm (NIXL, UCX shared memory), nixl_tcp (NIXL, UCX "
        "over TCP), tcp_mover (pdorch's TCP fallback mover).",
    ),
    block_kib: list[str] = typer.Option(
        ["16,256,2048"],
        "--block-kib",
        metavar="KIB,...",
        help="Block sizes in KiB, comma-separated or repeated. Add your model's KV block size "
        "(bytes per token x tokens per block, all layers) to see the fabric at the size P/D "
        "will move.",
    ),
    json_out: bool = typer.Option(
        False,
        "--json",
        help="Print exactly one JSON object on stdout ({'rows': [...], 'targets': [...], ...}) "
        "instead of the table; progress and logs go to stderr.",
    ),
) -> None:
    """Move KV blocks between two processes with every available method and compare GB/s.

    Block sizes 16 KiB, 256 KiB and 2 MiB (by default); contiguous and scattered block ids; every
    received block is verified (xxh3). "x memcpy" is a method's median GB/s over the best
    in-process memcpy of the same blocks. Targets: NIXL shm >= 0.5x memcpy at 2 MiB blocks;
    scattered 16 KiB blocks >= 2 GB/s (GB/s = 10^9 bytes per second).

    Example: `pdorch bench transfer --total-mib 128 --methods memcpy,nixl_shm --json`
    """
    import json
    from typing import Any

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from benchmarks.transfer_bench import METHODS, PATTERNS, run_bench

    chosen = tuple(split_list(methods, "--methods"))
    unknown = [m for m in chosen if m not in METHODS]
    if unknown or not chosen:
        raise typer.BadParameter(f"unknown methods {unknown}; choose from {list(METHODS)}")
    try:
        sizes = tuple(int(float(k) * 1024) for k in split_list(block_kib, "--block-kib"))
    except ValueError:
        raise typer.BadParameter(f"--block-kib: not numbers: {block_kib!r}") from None
    if not sizes or any(size <= 0 or size % 8 for size in sizes):
        raise typer.BadParameter("--block-kib: sizes must be positive multiples of 8 bytes")
    err = Console(stderr=True)
    total_cases = len(chosen) * len(sizes) * len(PATTERNS)
    with Progress(
        TextColumn("[bold]transfer bench"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} {task.description}"),
        TimeElapsedColumn(),
        console=err,
    ) as progress:
        task = progress.add_task("starting", total=total_cases)

        def on_row(row: dict[str, Any]) -> None:
            progress.update(
                task,
                advance=1,
                description=f"{row['method']} {row['block_bytes'] >> 10} KiB {row['pattern']}"
                f" {row['gbps']:.2f} GB/s",
            )

        report = run_bench(total_mib, chosen, on_row, sizes)

    if json_out:
        print(json.dumps(report))
        return
    table = Table(title=f"KV block transfer, {total_mib} MiB per repetition (median GB/s)")
    for column in ("method", "block", "pattern", "GB/s", "best GB/s", "x memcpy", "verified"):
        table.add_column(column, justify="left" if column in ("method", "pattern") else "right")
    for row in report["rows"]:
        ratio = row.get("ratio_to_memcpy")
        table.add_row(
            row["method"],
            f"{row['block_bytes'] >> 10} KiB",
            row["pattern"],
            f"{row['gbps']:.2f}",
            f"{row.get('gbps_best', 0.0):.2f}",
            "-" if ratio is None else f"{ratio:.2f}",
            "yes" if row["verified"] else f"NO {row.get('error', '')}",
        )
    console = Console()
    console.print(table)
    for target in report["targets"]:
        mark = {True: "[green]met[/green]", False: "[red]not met[/red]"}.get(
            target["met"], "n/a (method not run)"
        )
        console.print(f"target: {target['name']}: {mark} ({target['values']})")
