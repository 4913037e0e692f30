"""`python -m transfer.peer`: a block owner in its own process, driven by JSON lines.

Tests and the transfer benchmark need an owner that is a real separate process (so that it can
be killed or stopped, and so that NIXL/UCX really cross a process boundary). It fills its pool
with `pattern.block_pattern(seed, i, block_bytes)`, starts a mover, prints
`{"event": "ready", "address": {...}, "pid": N}` and then reads commands on stdin, one JSON object
per line:

* `{"cmd": "hold", "request_id": R, "block_ids": [...], "lease_s": S}` → `{"event": "held", ...}`
* `{"cmd": "release", "request_id": R}` → `{"event": "release_result", "released": bool}`
* `{"cmd": "stats"}` → `{"event": "stats", ...MoverStats fields}`
* `{"cmd": "quit"}` (or end of stdin) → closes the mover and exits 0.

Every freed lease is reported as `{"event": "released", "request_id", "reason", "block_ids"}`;
a refused command as `{"event": "error", "cmd", "message"}`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import threading
from typing import Any

from transfer.contract import Released
from transfer.factory import make_block_mover
from transfer.nixl_mover import NixlSettings
from transfer.pattern import fill_pool
from transfer.pool import KvBlockPool
from transfer.transports import KvTransport, UcxTransport


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _stdin_lines(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[str | None]) -> None:
    for line in sys.stdin:
        loop.call_soon_threadsafe(queue.put_nowait, line)
    loop.call_soon_threadsafe(queue.put_nowait, None)


async def serve(args: argparse.Namespace) -> None:
    pool = KvBlockPool(args.num_blocks, args.block_bytes)
    fill_pool(pool, args.seed)

    def on_release(released: Released) -> None:
        _emit(
            {
                "event": "released",
                "request_id": released.request_id,
                "reason": released.reason,
                "block_ids": list(released.block_ids),
            }
        )

    mover = make_block_mover(
        pool,
        args.kind,
        engine_id=args.engine_id,
        host=args.host,
        port=args.port,
        on_release=on_release,
        settings=NixlSettings(transport=args.transport),
    )
    await mover.start()
    _emit({"event": "ready", "address": mover.address.model_dump(), "kind": mover.kind})
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    threading.Thread(
        target=_stdin_lines, args=(asyncio.get_running_loop(), queue), daemon=True
    ).start()
    try:
        while (line := await queue.get()) is not None:
            if not line.strip():
                continue
            command: dict[str, Any] = json.loads(line)
            cmd = command.get("cmd")
            try:
                if cmd == "quit":
                    break
                if cmd == "hold":
                    mover.hold(command["request_id"], command["block_ids"], command["lease_s"])
                    _emit({"event": "held", "request_id": command["request_id"]})
                elif cmd == "release":
                    released = mover.release(command["request_id"])
                    _emit({"event": "release_result", "released": released})
                elif cmd == "stats":
                    _emit({"event": "stats", **dataclasses.asdict(mover.stats())})
                else:
                    raise ValueError(f"unknown cmd {cmd!r}")
            except Exception as exc:
                _emit({"event": "error", "cmd": cmd, "message": str(exc)})
    finally:
        await mover.close()
    _emit({"event": "closed"})


def command(kind: str, transport: str, num_blocks: int, block_bytes: int, seed: int) -> list[str]:
    """The command line that starts this peer with this interpreter (for the tests and the
    transfer benchmark, so its flags are spelled in one place)."""
    return [
        sys.executable, "-m", "transfer.peer", "--kind", kind, "--transport", transport,
        "--num-blocks", str(num_blocks), "--block-bytes", str(block_bytes), "--seed", str(seed),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m transfer.peer", description=__doc__)
    kinds = [k for k in KvTransport if k is not KvTransport.NONE]
    parser.add_argument("--kind", type=KvTransport, choices=kinds, default=KvTransport.AUTO)
    parser.add_argument(
        "--transport", type=UcxTransport, choices=list(UcxTransport), default=UcxTransport.AUTO
    )
    parser.add_argument("--num-blocks", type=int, required=True)
    parser.add_argument("--block-bytes", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine-id", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
