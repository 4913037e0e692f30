"""Routing policies by name: the compatibility layer over `router/plugins/`.

A policy is a named profile (`router/profiles/NAME.yaml`) of plugin parts; `config.py` is the
YAML schema a fleet file's pool `policy:` and `pdorch bench sim --router-config` take, and
`build_policy` turns one into a `router.plugins.profile.Profile`. The formulas live in the
parts (`router/plugins/{filters,scorers,pickers}/`), once each.
"""

from __future__ import annotations

from router.plugins.spec import deprecated_aliases, get_profile_spec, profile_names
from router.policies.config import (
    PolicyConfig,
    PolicyConfigError,
    RouterPolicyConfig,
    build_policy,
    load_router_config,
)

__all__ = [
    "PolicyConfig",
    "PolicyConfigError",
    "RouterPolicyConfig",
    "build_policy",
    "deprecated_aliases",
    "get_profile_spec",
    "load_router_config",
    "profile_names",
]
