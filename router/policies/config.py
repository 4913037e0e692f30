"""Router configuration from YAML: per role a policy (a named profile, adjustable), plus the
P/D decision's parameters::

    prefill:
      name: llmd                               # a shipped profile (router/profiles/)
      weights: {prefix: 3, queue: 2, kv_utilization: 2}
    decode:
      name: token_load_decode
      params: {expected_output_tokens: 512}    # set on every part of the profile that has it
    pd:
      min_uncached_tokens: 512
      max_prefill_queue_s: 1.0
    late_binding: {enabled: true, hold_queued_s: 0.5}   # router/late_binding.py (default off)

A policy may also replace a profile's sections, or define a new profile in place::

    prefill:
      name: my_mix                             # not shipped: scorers (and a picker) required
      filters: [{name: health}]
      scorers: [{name: prefix, weight: 2}, {name: token_load, weight: 1000}]
      picker: {name: softmax, params: {temperature: 0.2, seed: 1}}

Errors are `PolicyConfigError` (a `ValueError`) whose message names the offending field as a
dotted path (`prefill.params.balance_abs_threshold: ...`), so a typo in a long fleet file
points at its line. `load_router_config` also accepts the above under a top-level `router:`
key. A fleet file carries the same policies as `pools.{prefill,decode}.policy` and `pd`
(`pdorch.config.fleet.FleetConfig.router_policy_config`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from router.late_binding import LateBindingParams
from router.pd_decision import PdDecisionParams
from router.plugins.profile import Profile
from router.plugins.spec import (
    PartSpec,
    ScorerSpec,
    build_profile,
    format_error,
    profile_spec,
)
from router.plugins.spec import ProfileError as PolicyConfigError

__all__ = [
    "PolicyConfig",
    "PolicyConfigError",
    "RouterPolicyConfig",
    "build_policy",
    "load_router_config",
]


class PolicyConfig(BaseModel):
    """One policy: profile `name`, `params` and `weights` adjustments, optional sections."""

    model_config = ConfigDict(extra="forbid")
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    weights: dict[str, float] | None = None
    filters: list[PartSpec] | None = None
    scorers: list[ScorerSpec] | None = None
    picker: PartSpec | None = None


class RouterPolicyConfig(BaseModel):
    """The router's policies per role plus the P/D decision parameters."""

    model_config = ConfigDict(extra="forbid")
    prefill: PolicyConfig = Field(default_factory=lambda: PolicyConfig(name="token_load"))
    decode: PolicyConfig = Field(default_factory=lambda: PolicyConfig(name="token_load_decode"))
    pd: PdDecisionParams = Field(default_factory=PdDecisionParams)
    # Hold requests at the router while every prefilling replica is busy (router/late_binding.py)
    late_binding: LateBindingParams = Field(default_factory=LateBindingParams)


def build_policy(
    config: PolicyConfig | Mapping[str, Any],
    rng: random.Random | None = None,
    field_prefix: str = "",
) -> Profile:
    """Instantiate the configured profile, validating every part, param and weight."""
    if not isinstance(config, PolicyConfig):
        try:
            config = PolicyConfig.model_validate(dict(config))
        except ValidationError as err:
            raise PolicyConfigError(format_error(err, field_prefix)) from None
    spec = profile_spec(config.name, config.filters, config.scorers, config.picker, field_prefix)
    return build_profile(spec, config.params, config.weights, rng=rng, where=field_prefix)


def _router_section(data: dict[str, Any]) -> dict[str, Any]:
    """The router part of a file: its top-level `router:` section, or the file itself."""
    if "router" not in data:
        return data
    section = data["router"]
    if not isinstance(section, dict):
        raise PolicyConfigError("router: expected a mapping")
    return section


def load_router_config(source: str | Path | Mapping[str, Any]) -> RouterPolicyConfig:
    """Parse a router config from YAML text, a YAML file, or a mapping (see module docstring).

    Profiles, parts, params and weights are validated here too, so a bad file fails at load.
    """
    if isinstance(source, Path):
        data: Any = yaml.safe_load(source.read_text())
    elif isinstance(source, str):
        data = yaml.safe_load(source)
    else:
        data = dict(source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyConfigError("router config: expected a mapping at the top level")
    data = _router_section(data)
    try:
        config = RouterPolicyConfig.model_validate(data)
    except ValidationError as err:
        raise PolicyConfigError(format_error(err, "")) from None
    build_policy(config.prefill, field_prefix="prefill")
    build_policy(config.decode, field_prefix="decode")
    return config
