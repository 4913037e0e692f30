"""Benchmark policy names -> router configs (prefill policy, decode policy, P/D decision).

- `token_load`: prefill `token_load`, decode `token_load_decode`.
- `latency_predictor`: prefill `latency_predictor` (token_load calibrated by the lifecycle's
  learnt per-replica latency fit), decode `token_load_decode`.
- `round_robin`, `least_request`, `consistent_hash`, `cache_aware`, `llmd`, `dynamo`: the same
  policy for prefill and decode (each has a load or session notion that applies to decode).
- `kv_overlap`: prefill `kv_overlap`, decode `least_request` (pure overlap has no load notion:
  on a decode pool it would send every new session to one replica).

On colocated fleets only the prefill pick is used (see `router/pd_router.py`).

A suffix selects the P/D decision: `NAME/conditional` (default: `router/pd_decision.py`
defaults), `NAME/always` (disaggregate every request: `min_uncached_tokens` 0, no saturation
limit), `NAME/never` (decode always prefills locally). Parameters of the prefill policy
follow `@`: `token_load@expected_output_tokens=1024` (several: `@a=1@b=2`), for studies that sweep
a documented parameter; the spec string is the policy's name in reports.

A `+late` suffix turns on late binding (`router/late_binding.py`) with its defaults, on any
policy: `dynamo+late`; its parameters follow `:`: `token_load+late:hold_queued_s=0.3:aging=2`.
A `+decode:KEY=VALUE[:...]` suffix sets parameters of the *decode* policy (the `@` ones go to
the prefill policy): `token_load+decode:transfer_weight=2` (token_load_decode's KV-transfer
term). A `+pd:KEY=VALUE[:...]` suffix sets P/D decision parameters
(`router/pd_decision.py`): `token_load+pd:compare_finish=true` (the queue-aware local prefill).
"""

from __future__ import annotations

import json

from router.late_binding import LateBindingParams
from router.pd_decision import PdDecisionParams
from router.policies.config import PolicyConfig, RouterPolicyConfig

POLICY_PAIRS: dict[str, tuple[str, str]] = {
    "token_load": ("token_load", "token_load_decode"),
    "latency_predictor": ("latency_predictor", "token_load_decode"),
    "round_robin": ("round_robin", "round_robin"),
    "least_request": ("least_request", "least_request"),
    "consistent_hash": ("consistent_hash", "consistent_hash"),
    "cache_aware": ("cache_aware", "cache_aware"),
    "kv_overlap": ("kv_overlap", "least_request"),
    "llmd": ("llmd", "llmd"),
    "dynamo": ("dynamo", "dynamo"),
}

PD_MODES = ("conditional", "always", "never")


def router_config_for(spec: str) -> RouterPolicyConfig:
    """The router config of a benchmark policy name like `token_load` or `llmd/never`."""
    spec, *modifiers = spec.split("+")
    late: dict[str, object] | None = None
    decode_params: dict[str, object] = {}
    pd_params: dict[str, object] = {}
    for modifier in modifiers:
        mname, *items = modifier.split(":")
        if mname == "late":
            late = {"enabled": True, **_assignments(items, spec)}
        elif mname == "decode":
            decode_params.update(_assignments(items, spec))
        elif mname == "pd":
            pd_params.update(_assignments(items, spec))
        else:
            raise ValueError(f"policies: unknown modifier {modifier!r}; known: late, decode, pd")
    head, *assignments = spec.split("@")
    name, _, mode = head.partition("/")
    mode = mode or "conditional"
    params = _assignments(assignments, spec)
    if name not in POLICY_PAIRS:
        raise ValueError(f"policies: unknown policy {name!r}; known: {', '.join(POLICY_PAIRS)}")
    if mode not in PD_MODES:
        raise ValueError(f"policies: unknown P/D mode {mode!r} in {spec!r}; known: {PD_MODES}")
    prefill, decode = POLICY_PAIRS[name]
    if mode == "always":
        pd_params = {"min_uncached_tokens": 0, "max_prefill_queue_s": float("inf"), **pd_params}
    elif mode == "never":
        pd_params = {"enabled": False, **pd_params}
    pd = PdDecisionParams.model_validate(pd_params)
    return RouterPolicyConfig(
        prefill=PolicyConfig(name=prefill, params=params),
        decode=PolicyConfig(name=decode, params=decode_params),
        pd=pd,
        late_binding=LateBindingParams.model_validate(late or {}),
    )


def _assignments(items: list[str], spec: str) -> dict[str, object]:
    """`KEY=VALUE` items (values as JSON when they parse, else strings)."""
    params: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"policies: {item!r} in {spec!r} is not KEY=VALUE")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params
