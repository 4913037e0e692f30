"""httpx clients that never reuse a connection the server is just closing.

uvicorn (vLLM's server, the simulated engine's, the coordinator's) closes a keep-alive
connection after 5 s idle; httpx's default `keepalive_expiry` is also 5 s. With equal timers a
request sent on a connection idle for ~5 s races the server's close and fails with
`httpx.ReadError` / `RemoteProtocolError` although the server is healthy (seen in CI: a P/D
test whose prefill leg took ~5 s on a busy box, then reused the decode engine's connection).
Expiring our side at 4 s, as the coordinator's aiohttp legs do (`pdorch/app/upstream.py`),
closes the window: a connection idle past 4 s is dropped and a fresh one opened.
"""

from __future__ import annotations

from typing import Any

import httpx

SERVER_KEEPALIVE_S = 5.0  # uvicorn's `timeout_keep_alive` default (vLLM keeps it)
KEEPALIVE_EXPIRY_S = 4.0  # below the server's, see the module docstring


def client_limits(
    *, max_connections: int | None = 100, max_keepalive_connections: int | None = 20
) -> httpx.Limits:
    """httpx's pool limits (its defaults unless given) with the keep-alive expiry above."""
    return httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_keepalive_connections,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )


def http_client(*, limits: httpx.Limits | None = None, **kwargs: Any) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` (same keyword arguments) whose pooled connections expire before
    the server's keep-alive close; `limits`, when given, should come from `client_limits`."""
    return httpx.AsyncClient(limits=limits or client_limits(), **kwargs)
