"""Free loopback ports chosen at run time, so parallel engines and tests never collide."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports: all sockets stay bound until every port is chosen.

    Picking ports one by one can return the same port twice (the OS may reuse a port that was
    just released); holding them together rules that out.
    """
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(s)
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()
