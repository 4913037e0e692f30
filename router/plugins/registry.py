"""Part registry: (kind, name) → class, for filters, scorers and pickers.

Built-in parts register on import of `router.plugins`; a project adds its own with the same
decorator (`@register` on a `Filter`/`Scorer`/`Picker` subclass) and names it in a profile.
"""

from __future__ import annotations

from typing import Any, TypeVar

from router.plugins.base import Part

_PARTS: dict[tuple[str, str], type[Part[Any]]] = {}

T = TypeVar("T", bound=type[Part[Any]])


def register(cls: T) -> T:
    """Class decorator: register a part under its `kind` and `name`."""
    if not cls.kind or not cls.name:
        raise ValueError(f"{cls.__qualname__} needs a `kind` and a `name`")
    key = (cls.kind, cls.name)
    if key in _PARTS and _PARTS[key] is not cls:
        raise ValueError(f"{cls.kind} name {cls.name!r} is already registered")
    _PARTS[key] = cls
    return cls


def get_part(kind: str, name: str) -> type[Part[Any]]:
    """The `kind` ("filter" | "scorer" | "picker") part registered as `name`."""
    try:
        return _PARTS[(kind, name)]
    except KeyError:
        raise KeyError(f"unknown {kind} {name!r}; known: {part_names(kind)}") from None


def part_names(kind: str) -> list[str]:
    """Registered names of one kind, sorted."""
    return sorted(n for k, n in _PARTS if k == kind)
