"""Refuse to load non-loopback endpoints unless the user says so.

A load generator pointed at the wrong URL is a denial-of-service tool. By default only
loopback targets are accepted (`localhost`, `127.0.0.0/8`, `::1`); anything else needs
`--allow-remote`. Host names other than `localhost` are not resolved: a name could point
anywhere, so it needs the flag too.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

__all__ = ["RemoteUrlError", "check_target_url"]


class RemoteUrlError(ValueError):
    """The URL is not loopback and `allow_remote` was not given."""


def check_target_url(url: str, *, allow_remote: bool = False) -> str:
    """Validate `url` (http/https, host present) and return it without a trailing slash."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"--url must start with http:// or https://, got {url!r}")
    host = parts.hostname
    if not host:
        raise ValueError(f"--url has no host: {url!r}")
    if not allow_remote and not _is_loopback(host):
        raise RemoteUrlError(
            f"refusing to send load to non-loopback host {host!r}; pass --allow-remote if this "
            "endpoint is yours to load"
        )
    return url.rstrip("/")


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
