"""Profile specs (YAML) and how a configured policy becomes a `Profile`.

A profile file (`router/profiles/NAME.yaml`, shipped as package data)::

    name: llmd
    description: llm-d's default scheduling profile
    aliases: [llm_d, llm-d]                 # deprecated names: still work, with a warning
    filters: [{name: health}]               # default: [health]
    scorers:                                # at least one; weights live here, not in scorers
      - {name: prefix, weight: 3}
      - {name: queue, weight: 2}
      - {name: kv_utilization, weight: 2}
    picker: {name: max_score}               # default: max_score

A router config names a profile and may adjust it (`router.policies.config.PolicyConfig`):

- `params: {KEY: VALUE}` sets `KEY` on every part of the profile whose params model has it
  (`expected_output_tokens` reaches both the `kv_headroom` filter and the
  `token_load_decode` scorer); a key no part takes is an error;
- `weights: {SCORER: W}` replaces scorer weights; an unknown scorer is an error;
- `filters`, `scorers`, `picker` replace those sections; with them `name` may be a new
  profile's name (then `scorers` is required).

Every error is a `ProfileError` naming the field as a dotted path
(`prefill.params.balance_abs_threshold: Input should be greater than or equal to 0`).
"""

from __future__ import annotations

import contextlib
import random
import warnings
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from router.plugins.base import Filter, Picker, Scorer
from router.plugins.profile import Profile
from router.plugins.registry import get_part


class ProfileError(ValueError):
    """A profile or its adjustment is invalid; the message names the field."""


class PartSpec(BaseModel):
    """One filter or picker: its registered `name` and `params`."""

    model_config = ConfigDict(extra="forbid")
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class ScorerSpec(PartSpec):
    """One scorer and its weight in the profile's total."""

    weight: float = 1.0


def _default_filters() -> list[PartSpec]:
    return [PartSpec(name="health")]


class ProfileSpec(BaseModel):
    """A whole profile (see module docstring)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    aliases: list[str] = Field(default_factory=list)
    filters: list[PartSpec] = Field(default_factory=_default_filters)
    scorers: list[ScorerSpec] = Field(min_length=1)
    picker: PartSpec = Field(default_factory=lambda: PartSpec(name="max_score"))


def format_error(err: ValidationError, prefix: str) -> str:
    """pydantic errors as `dotted.path: message`, joined by `; `."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in (*([prefix] if prefix else []), *e["loc"]))
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


@cache
def _shipped() -> tuple[dict[str, ProfileSpec], dict[str, str]]:
    specs: dict[str, ProfileSpec] = {}
    aliases: dict[str, str] = {}
    for entry in sorted(resources.files("router.profiles").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".yaml"):
            continue
        try:
            spec = ProfileSpec.model_validate(yaml.safe_load(entry.read_text()))
        except ValidationError as err:  # a broken shipped file is a bug: fail loudly
            raise ProfileError(f"router/profiles/{entry.name}: {format_error(err, '')}") from None
        specs[spec.name] = spec
        for alias in spec.aliases:
            aliases[alias] = spec.name
    return specs, aliases


def profile_names() -> list[str]:
    """Names of the shipped profiles, sorted (deprecated aliases not included)."""
    return sorted(_shipped()[0])


def deprecated_aliases() -> dict[str, str]:
    """Deprecated alias → current profile name."""
    return dict(_shipped()[1])


def get_profile_spec(name: str) -> ProfileSpec:
    """The shipped profile `name` (an alias warns with `DeprecationWarning`); `KeyError`."""
    specs, aliases = _shipped()
    if name in specs:
        return specs[name]
    if name in aliases:
        warnings.warn(
            f"policy name {name!r} is deprecated; use {aliases[name]!r}",
            DeprecationWarning,
            stacklevel=2,
        )
        return specs[aliases[name]]
    raise KeyError(f"unknown policy {name!r}; known: {profile_names()}")


def _build_part(
    kind: str, spec: PartSpec, overrides: Mapping[str, Any], where: str, override_where: str
) -> Any:
    try:
        cls = get_part(kind, spec.name)
    except KeyError as err:
        raise ProfileError(f"{where}.name: {err.args[0]}") from None
    fields = cls.params_model.model_fields
    mine = {k: v for k, v in overrides.items() if k in fields}
    try:
        params = cls.params_model.model_validate({**spec.params, **mine})
    except ValidationError as err:
        bad = {str(e["loc"][0]) for e in err.errors() if e["loc"]}
        prefix = override_where if bad and bad <= set(mine) else f"{where}.params"
        raise ProfileError(format_error(err, prefix)) from None
    return cls(params)


def build_profile(
    spec: ProfileSpec,
    params: Mapping[str, Any] | None = None,
    weights: Mapping[str, float] | None = None,
    rng: random.Random | None = None,
    where: str = "",
) -> Profile:
    """Instantiate `spec` with `params` and `weights` adjustments (see module docstring)."""
    at = f"{where}." if where else ""
    params = dict(params or {})
    weights = dict(weights or {})
    scorer_names = [s.name for s in spec.scorers]
    unknown = sorted(set(weights) - set(scorer_names))
    if unknown:
        raise ProfileError(
            f"{at}weights: unknown scorer(s) {unknown} for policy {spec.name!r}; "
            f"known: {scorer_names}"
        )
    if len(set(scorer_names)) != len(scorer_names):
        raise ProfileError(f"{at}scorers: a scorer appears twice in {scorer_names}")
    taken: set[str] = set()
    for kind, part in [
        *(("filter", f) for f in spec.filters),
        *(("scorer", s) for s in spec.scorers),
        ("picker", spec.picker),
    ]:
        with contextlib.suppress(KeyError):  # an unknown part is reported by _build_part
            taken |= set(get_part(kind, part.name).params_model.model_fields)
    for key in params:
        if key not in taken:
            raise ProfileError(
                f"{at}params.{key}: Extra inputs are not permitted (no part of policy "
                f"{spec.name!r} takes it)"
            )
    ow = f"{at}params"
    filters: list[Filter[Any]] = [
        _build_part("filter", f, params, f"{at}filters.{i}", ow) for i, f in enumerate(spec.filters)
    ]
    scorers: list[tuple[Scorer[Any], float]] = [
        (
            _build_part("scorer", s, params, f"{at}scorers.{i}", ow),
            float(weights.get(s.name, s.weight)),
        )
        for i, s in enumerate(spec.scorers)
    ]
    picker: Picker[Any] = _build_part("picker", spec.picker, params, f"{at}picker", ow)
    try:
        return Profile(spec.name, filters, scorers, picker, rng=rng)
    except ValueError as err:
        msg = str(err)
        key = msg.partition(":")[0]
        if key in params:
            raise ProfileError(f"{at}params.{msg}") from None
        if key in type(picker).params_model.model_fields:
            raise ProfileError(f"{at}picker.params.{msg}") from None
        raise ProfileError(f"{at}picker: {msg}") from None


def profile_spec(
    name: str,
    filters: Sequence[PartSpec] | None = None,
    scorers: Sequence[ScorerSpec] | None = None,
    picker: PartSpec | None = None,
    where: str = "",
) -> ProfileSpec:
    """The shipped profile `name` with any of its sections replaced, or a new profile."""
    at = f"{where}." if where else ""
    try:
        base: ProfileSpec | None = get_profile_spec(name)
    except KeyError as err:
        if scorers is None:
            raise ProfileError(f"{at}name: {err.args[0]}") from None
        base = None
    data: dict[str, Any] = base.model_dump() if base is not None else {"name": name}
    if filters is not None:
        data["filters"] = [f.model_dump() for f in filters]
    if scorers is not None:
        data["scorers"] = [s.model_dump() for s in scorers]
    if picker is not None:
        data["picker"] = picker.model_dump()
    if base is None or filters is not None or scorers is not None or picker is not None:
        data["name"] = name
        data["aliases"] = []
    try:
        return ProfileSpec.model_validate(data)
    except ValidationError as err:
        raise ProfileError(format_error(err, where)) from None
