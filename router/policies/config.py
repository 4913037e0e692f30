"""Policy configuration from YAML: a name, its parameters, and (for scorer mixes) weights.

One block per role; the P/D decision's parameters sit beside them::

    prefill:
      name: llmd
      weights: {prefix: 3, queue: 2, kv_utilization: 2}
    decode:
      name: token_load_decode
      params: {expected_output_tokens: 512}
    pd:
      min_uncached_tokens: 512
      max_prefill_queue_s: 1.0

Errors are `PolicyConfigError` (a `ValueError`) whose message names the offending field as a
dotted path (`prefill.params.balance_abs_threshold: ...`), built from pydantic's error
locations, so a typo in a 200-line fleet file points at its line.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from router.pd_decision import PdDecisionParams
from router.policies.base import Policy
from router.policies.registry import get_policy


class PolicyConfigError(ValueError):
    """A policy configuration is invalid; the message names the field."""


class PolicyConfig(BaseModel):
    """One policy: registered `name`, its `params`, and `weights` for scorer mixes."""

    model_config = ConfigDict(extra="forbid")
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    weights: dict[str, float] | None = None


class RouterPolicyConfig(BaseModel):
    """The router's policies per role plus the P/D decision parameters."""

    model_config = ConfigDict(extra="forbid")
    prefill: PolicyConfig = Field(default_factory=lambda: PolicyConfig(name="token_load"))
    decode: PolicyConfig = Field(default_factory=lambda: PolicyConfig(name="token_load_decode"))
    pd: PdDecisionParams = Field(default_factory=PdDecisionParams)


def _format(err: ValidationError, prefix: str) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in (*([prefix] if prefix else []), *e["loc"]))
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


def build_policy(
    config: PolicyConfig | Mapping[str, Any],
    rng: random.Random | None = None,
    field_prefix: str = "",
) -> Policy[Any]:
    """Instantiate the configured policy, validating its params and weights."""
    if not isinstance(config, PolicyConfig):
        try:
            config = PolicyConfig.model_validate(dict(config))
        except ValidationError as err:
            raise PolicyConfigError(_format(err, field_prefix)) from None
    where = f"{field_prefix}." if field_prefix else ""
    try:
        cls = get_policy(config.name)
    except KeyError as err:
        raise PolicyConfigError(f"{where}name: {err.args[0]}") from None
    try:
        params = cls.params_model.model_validate(config.params)
    except ValidationError as err:
        raise PolicyConfigError(_format(err, f"{where}params")) from None
    try:
        return cls(params, weights=config.weights, rng=rng)
    except ValueError as err:
        raise PolicyConfigError(f"{where}{err}") from None


def load_router_config(source: str | Path | Mapping[str, Any]) -> RouterPolicyConfig:
    """Parse a router policy config from YAML text, a YAML file, or a mapping.

    Policy names, params and weights are validated here too, so a bad file fails at load time.
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
    try:
        config = RouterPolicyConfig.model_validate(data)
    except ValidationError as err:
        raise PolicyConfigError(_format(err, "")) from None
    build_policy(config.prefill, field_prefix="prefill")
    build_policy(config.decode, field_prefix="decode")
    return config
