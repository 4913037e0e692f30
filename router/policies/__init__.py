"""Routing policies: one module per policy, one interface (`Policy`), one registry.

Importing this package registers every built-in policy. See `router/README.md` for the
formula, parameters and defaults of each, and each module's docstring for the same beside code.
"""

from __future__ import annotations

from router.policies import (
    cache_aware,
    consistent_hash,
    dynamo,
    kv_overlap,
    least_request,
    llmd,
    round_robin,
    token_load,
)
from router.policies.base import NoParams, Policy
from router.policies.registry import deprecated_aliases, get_policy, policy_names, register

__all__ = [
    "NoParams",
    "Policy",
    "cache_aware",
    "consistent_hash",
    "deprecated_aliases",
    "dynamo",
    "get_policy",
    "kv_overlap",
    "least_request",
    "llmd",
    "policy_names",
    "register",
    "round_robin",
    "token_load",
]
