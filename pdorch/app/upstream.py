"""The coordinator's aiohttp client: the request legs' `aiohttp.ClientSession` when
`coordinator.leg_client: aiohttp` (`native`: `leg_client.py`, the same cap, keep-alive and
timeout rules on asyncio protocols + httptools), and always the health probes', scrapes' and
passthrough routes' session.

Why not the shared `httpx.AsyncClient` (still used for probes, scrapes, `/tokenize`, admin):
on the hot path httpcore scans every pooled connection per request (a poll + getpeername
syscall per idle connection, so CPU per request grows with concurrency) and writes each h11
event in its own `send()`; aiohttp pops a pooled connection in O(1), writes headers + body in
one `send()` and parses answers with its C parser (`benchmarks/results/proxy.md`).

Connector settings and why:
- `limit_per_host` = `coordinator.upstream_connections_per_replica` [1024] (aiohttp's
  "host" is host + port: one engine), `limit=0` (no cap over all engines). A leg past the cap
  waits for a free connection of that engine and does not fail: the pool wait is under
  aiohttp's `connect` timeout, which is unset, not under `sock_connect` (the socket connect
  alone), so a queued leg never reads as a connect failure of a healthy engine; the flow's
  deadlines (`prefill_timeout_s`, `first_byte_timeout_s`, `request_timeout_s`) bound the
  wait. 1024 is vLLM's largest default `max_num_seqs`, so the cap never holds back a batch;
  it bounds sockets and the connect storm of a burst. Admission control stays the
  coordinator's (`max_concurrent_requests`). Health probes and `/metrics` scrapes have a
  session of their own with no cap (`new_upstream_session(..., per_replica=0)`): a probe
  never queues behind the legs of a busy engine (it would time out and eject it).
- `keepalive_timeout=4 s`: below uvicorn's (vLLM's and the simulator's server) 5 s idle
  close, so we never reuse a connection the engine is just closing (that race would surface
  as a spurious `ServerDisconnectedError`, counted against a healthy replica). Under load the
  same connections are reused continuously.
- `enable_cleanup_closed=False`: it only reaps SSL transports that fail to close (and is a
  no-op on Python ≥ 3.12.7); engines are plain HTTP on the cluster network.
- TCP_NODELAY: aiohttp sets it on every connection it opens (`BaseProtocol.connection_made`).
- `auto_decompress=False` and no `Accept-Encoding` sent: the engine's bytes are streamed back
  unchanged, so they must never be compressed for us nor decoded by us. `User-Agent` is
  skipped too (one header less to build and parse per leg).
- Timeouts: every leg has `sock_connect` = `connect_timeout_s` (a refused or unreachable
  engine fails fast and the leg is retried elsewhere; it costs nothing on a reused
  connection). No leg gets a read timer (aiohttp re-arms it on every received packet, ~10% of
  a leg's client CPU, and on a stream that is per event): the flow bounds every leg, the
  prefill leg by `prefill_timeout_s`, everything before the first byte by `request_timeout_s`,
  a continuation's first byte by `prefill_timeout_s`, and a stream after its first byte by
  the relay's stall watchdog (`stall_timeout_s`, `proxy_stream.py`; the coordinator's
  `stream_timeout` is `leg_timeout(connect_timeout_s)`). `stream_timeout()` (a `sock_read`)
  stays for callers without such a watchdog. No `total` anywhere.
"""

from __future__ import annotations

import aiohttp

KEEPALIVE_TIMEOUT_S = 4.0
DEFAULT_CONNECTIONS_PER_REPLICA = 1024  # coordinator.upstream_connections_per_replica
SKIP_AUTO_HEADERS = ("User-Agent", "Accept-Encoding")


def leg_timeout(
    connect_timeout_s: float, read_timeout_s: float | None = None
) -> aiohttp.ClientTimeout:
    """The timeouts of one upstream leg (see the module docstring)."""
    return aiohttp.ClientTimeout(
        total=None, connect=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
    )


def stream_timeout(connect_timeout_s: float, read_timeout_s: float) -> aiohttp.ClientTimeout:
    """A streamed decode leg's timeouts: connect, and at most `read_timeout_s` between reads."""
    return leg_timeout(connect_timeout_s, read_timeout_s)


def new_upstream_session(
    connect_timeout_s: float, per_replica: int = DEFAULT_CONNECTIONS_PER_REPLICA
) -> aiohttp.ClientSession:
    """A keep-alive session for the legs (no read timer: `leg_timeout`), at most `per_replica`
    connections open to one engine (0: no cap); create it on the running loop, close it on
    stop."""
    connector = aiohttp.TCPConnector(
        limit=0,
        limit_per_host=per_replica,
        keepalive_timeout=KEEPALIVE_TIMEOUT_S,
        enable_cleanup_closed=False,
        ttl_dns_cache=300,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=leg_timeout(connect_timeout_s),
        auto_decompress=False,
        skip_auto_headers=SKIP_AUTO_HEADERS,
        raise_for_status=False,
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )
