"""Free loopback ports chosen at run time (the product's helper, re-exported for tests)."""

from __future__ import annotations

from pools.ports import free_port, free_ports

__all__ = ["free_port", "free_ports"]
