"""The SSRF guard of `POST /admin/pools/{pool}/replicas`: resolve, then ask the allow-list.

Every host of the body (`url`, `metrics_url`, `kv_events_endpoint`,
`kv_events_replay_endpoint`: the coordinator connects to each) is resolved here (the I/O)
and judged by `pdorch.config.replica_allow.check_host` (pure) against the fleet file's
`coordinator.replica_allow`; a refusal is a 403 naming the field and the address, before
anything connects. `ipc://` / `inproc://` endpoints name no host (local sockets) and pass.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from pdorch.app.errors import ApiError
from pdorch.config.replica_allow import (
    Address,
    AllowError,
    ReplicaAllowList,
    check_host,
    literal_address,
)
from pools.launch_spec import StaticEndpointSpec


def spec_hosts(spec: StaticEndpointSpec) -> list[tuple[str, str]]:
    """(field, host) for every endpoint of `spec` that names a network host."""
    out = []
    for field in ("url", "metrics_url", "kv_events_endpoint", "kv_events_replay_endpoint"):
        value = getattr(spec, field)
        if value is None:
            continue
        split = urlsplit(value)
        if split.scheme in ("ipc", "inproc"):
            continue
        # a ZMQ bind-style "tcp://*:5557" is no address to connect to: judged as the name "*"
        host = split.hostname or split.netloc.rpartition(":")[0] or split.netloc
        out.append((field, host))
    return out


async def _resolve(host: str) -> list[Address]:
    literal = literal_address(host)
    if literal is not None:
        return [literal]
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


async def check_spec(spec: StaticEndpointSpec, allow: ReplicaAllowList) -> None:
    """Raise a 403 `ApiError` unless every host of `spec` is allowed (module docstring)."""
    for field, host in spec_hosts(spec):
        try:
            check_host(field, host, await _resolve(host), allow)
        except AllowError as err:
            raise ApiError(403, str(err), param=field, code="replica_address_refused") from None
