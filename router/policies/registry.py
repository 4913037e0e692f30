"""Policy registry: names (and deprecated aliases) to policy classes.

Deprecated names stay registered, as llm-d keeps old plugin names: `get_policy` resolves them
with a `DeprecationWarning` that names the new one.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from router.policies.base import Policy

_POLICIES: dict[str, type[Policy[Any]]] = {}
_ALIASES: dict[str, str] = {}


def register(*aliases: str) -> Callable[[type[Policy[Any]]], type[Policy[Any]]]:
    """Class decorator: register a policy under its `name` and any deprecated `aliases`."""

    def decorate(cls: type[Policy[Any]]) -> type[Policy[Any]]:
        if not cls.name:
            raise ValueError(f"{cls.__qualname__} has no `name`")
        if cls.name in _POLICIES and _POLICIES[cls.name] is not cls:
            raise ValueError(f"policy name {cls.name!r} is already registered")
        _POLICIES[cls.name] = cls
        for alias in aliases:
            _ALIASES[alias] = cls.name
        return cls

    return decorate


def get_policy(name: str) -> type[Policy[Any]]:
    """The policy class registered as `name` (a deprecated alias warns and still works)."""
    if name in _POLICIES:
        return _POLICIES[name]
    if name in _ALIASES:
        current = _ALIASES[name]
        warnings.warn(
            f"policy name {name!r} is deprecated; use {current!r}",
            DeprecationWarning,
            stacklevel=2,
        )
        return _POLICIES[current]
    raise KeyError(f"unknown policy {name!r}; known: {policy_names()}")


def policy_names() -> list[str]:
    """Registered (non-deprecated) policy names, sorted."""
    return sorted(_POLICIES)


def deprecated_aliases() -> dict[str, str]:
    """Deprecated alias -> current name."""
    return dict(_ALIASES)
