"""A lean HTTP/1.1 keep-alive client for the proxy benchmark's load generator.

The generator must not be the bottleneck: httpx spends ~150-300 µs of Python per request,
which on a 2-core machine is the same order as the proxy under test. This client writes one
pre-built request per call on a persistent connection and parses only the status line,
`content-length`/`transfer-encoding` and `connection` (~20-40 µs per request). One connection
is used by one task at a time (the benchmark gives every concurrent worker its own).
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


class HttpError(RuntimeError):
    """Transport or protocol failure (connection reset, malformed response)."""


def split_url(url: str) -> tuple[str, int, str]:
    """`http://host:port/path` → (host, port, path)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"{url!r}: only http://host:port URLs are supported")
    return parts.hostname, parts.port or 80, parts.path or "/"


class RawHttpConnection:
    """One keep-alive connection to `host:port`; reconnects when the server closes it."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._host_header = f"{host}:{port}".encode()

    async def post_json(
        self, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """POST `body` as JSON; returns (status, response body). Retries once on a stale
        keep-alive connection (closed by the server between requests)."""
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
        request = b"".join(
            (
                b"POST ",
                path.encode(),
                b" HTTP/1.1\r\nhost: ",
                self._host_header,
                b"\r\ncontent-type: application/json\r\ncontent-length: ",
                str(len(body)).encode(),
                b"\r\n",
                extra,
                b"\r\n",
                body,
            )
        )
        fresh = self._writer is None
        try:
            return await self._exchange(request)
        except (ConnectionError, asyncio.IncompleteReadError, HttpError):
            self.close()
            if fresh:
                raise
        return await self._exchange(request)

    async def _exchange(self, request: bytes) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        self._writer.write(request)
        reader = self._reader
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
            raise HttpError(f"malformed status line {lines[0]!r}")
        status = int(status_line[1])
        length = -1
        chunked = False
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = value.strip().lower() == b"close"
        if chunked:
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            body = b"".join(parts)
        elif length >= 0:
            body = await reader.readexactly(length)
        else:
            body = await reader.read()
            close = True
        if close:
            self.close()
        return status, body

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
