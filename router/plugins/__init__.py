"""Routing as a pipeline of plugins: filters, weighted scorers and a picker per profile.

Importing this package registers every built-in part (`router.plugins.registry`). Profiles
(`router/profiles/*.yaml`) combine them; `router.plugins.spec` loads and builds them, and
`router.plugins.profile.Profile` runs one decision. See `router/README.md` ("Parts and
profiles") and each part's module docstring for its formula, parameters and defaults.
"""

from __future__ import annotations

from router.plugins.filters import health, kv_headroom, role
from router.plugins.pickers import cache_aware, lexicographic, max_score, softmax
from router.plugins.scorers import (
    dynamo_cost,
    kv_utilization,
    latency_predictor,
    least_request,
    prefix,
    queue,
    round_robin,
    session_hash,
    text_prefix,
    token_load,
    token_load_decode,
)

__all__ = [
    "cache_aware",
    "dynamo_cost",
    "health",
    "kv_headroom",
    "kv_utilization",
    "latency_predictor",
    "least_request",
    "lexicographic",
    "max_score",
    "prefix",
    "queue",
    "role",
    "round_robin",
    "session_hash",
    "softmax",
    "text_prefix",
    "token_load",
    "token_load_decode",
]
