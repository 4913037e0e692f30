"""Pick a mover: NIXL when it can be imported, else the TCP fallback."""

from __future__ import annotations

from collections.abc import Callable

from transfer.contract import BlockMover, Released
from transfer.errors import BackendUnavailable
from transfer.nixl_mover import NixlBlockMover, NixlSettings, nixl_available
from transfer.pool import KvBlockPool
from transfer.tcp_mover import TcpBlockMover
from transfer.transports import KvTransport


def make_block_mover(
    pool: KvBlockPool,
    kind: KvTransport = KvTransport.AUTO,
    *,
    engine_id: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    on_release: Callable[[Released], None] | None = None,
    settings: NixlSettings | None = None,
    default_timeout_s: float = 10.0,
) -> BlockMover:
    """`kind=auto`: NIXL if importable, else TCP. `kind=nixl` without NIXL raises
    BackendUnavailable (no silent downgrade when NIXL was asked for); `kind=none` is a
    ValueError (the caller wants no mover)."""
    kind = KvTransport(kind)
    if kind is KvTransport.NONE:
        raise ValueError("kind='none' asks for no mover")
    use_nixl = kind is KvTransport.NIXL or (kind is KvTransport.AUTO and nixl_available())
    if kind is KvTransport.NIXL and not nixl_available():
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
