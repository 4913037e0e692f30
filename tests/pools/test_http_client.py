"""Our httpx clients expire pooled connections before the servers' keep-alive close."""

from __future__ import annotations

import httpx

from pools.http_client import KEEPALIVE_EXPIRY_S, SERVER_KEEPALIVE_S, client_limits, http_client


def _expiry(client: httpx.AsyncClient) -> float | None:
    pool = client._transport._pool  # type: ignore[attr-defined]  # httpcore's pool, no public API
    expiry: float | None = pool._keepalive_expiry
    return expiry


async def test_clients_expire_idle_connections_before_the_server_closes_them() -> None:
    assert KEEPALIVE_EXPIRY_S < SERVER_KEEPALIVE_S
    async with http_client(timeout=1.0) as plain:
        assert _expiry(plain) == KEEPALIVE_EXPIRY_S
    limits = client_limits(max_connections=None, max_keepalive_connections=8)
    async with http_client(limits=limits) as sized:
        assert _expiry(sized) == KEEPALIVE_EXPIRY_S
    # httpx's own default equals uvicorn's 5 s: the race this module exists for
    async with httpx.AsyncClient() as default:
        assert _expiry(default) == SERVER_KEEPALIVE_S
