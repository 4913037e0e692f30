"""The router's shared names: pools and route kinds (one string set each, `StrEnum`).

`StrEnum` members *are* their strings (`PoolName.DECODE == "decode"`, `f"{kind}"` is the
value), so YAML, JSON, Prometheus labels and headers keep reading exactly what they read
before these enums existed.
"""

from __future__ import annotations

from enum import StrEnum


class PoolName(StrEnum):
    """A fleet pool: who prefills, who decodes, who does both."""

    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"


class RouteKind(StrEnum):
    """How one request is served; the value is the `x-pdorch-route` header and the
    `pdorch_routes_total{route=...}` label.

    - `pd`: a prefill replica prefills, a decode replica loads its KV and decodes;
    - `local`: a decode replica prefills and decodes (the P/D decision said no);
    - `colocated`: a colocated replica serves the whole request;
    - `fallback`: routed `pd`, but the prefill leg failed (or a decode engine that may have
      claimed the prefill's blocks failed), so a decode replica prefills locally.

    `PdRouter` decides one of the first three; only the lifecycle turns a route into `fallback`.
    """

    PD = "pd"
    LOCAL = "local"
    COLOCATED = "colocated"
    FALLBACK = "fallback"
