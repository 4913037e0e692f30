"""Pick a mover: NIXL when it can be imported, else the TCP fallback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from transfer.errors import BackendUnavailable
from transfer.mover import BlockMover, Released
from transfer.nixl_mover import NixlBlockMover, NixlSettings, nixl_available
from transfer.pool import KvBlockPool
from transfer.tcp_mover import TcpBlockMover

MoverKind = Literal["auto", "nixl", "tcp"]


def make_block_mover(
    pool: KvBlockPool,
    kind: MoverKind = "auto",
    *,
    engine_id: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    on_release: Callable[[Released], None] | None = None,
    settings: NixlSettings | None = None,
    default_timeout_s: float = 10.0,
) -> BlockMover:
    """`kind="auto"`: NIXL if importable, else TCP. `kind="nixl"` without NIXL raises
    BackendUnavailable (no silent downgrade when NIXL was asked for)."""
    use_nixl = kind == "nixl" or (kind == "auto" and nixl_available())
    if kind == "nixl" and not nixl_available():
        raise BackendUnavailable("kind='nixl' but nixl cannot be imported")
    if use_nixl:
        return NixlBlockMover(
            pool,
            engine_id=engine_id,
            host=host,
            port=port,
            on_release=on_release,
            settings=settings,
            default_timeout_s=default_timeout_s,
        )
    return TcpBlockMover(
        pool,
        engine_id=engine_id,
        host=host,
        port=port,
        on_release=on_release,
        default_timeout_s=default_timeout_s,
    )
