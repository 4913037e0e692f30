"""Policy config from YAML: registry, params, weights, errors that name the field."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import pytest

from router.policies import deprecated_aliases, get_policy, policy_names, register
from router.policies.base import NoParams, Policy
from router.policies.cache_aware import CacheAwarePolicy
from router.policies.config import (
    PolicyConfigError,
    build_policy,
    load_router_config,
)
from router.policies.llmd import LlmdPolicy
from router.replica_state import PolicyDecision, ReplicaSnapshot, RoutingRequest

EXAMPLE = """
prefill:
  name: llmd
  weights: {prefix: 3, queue: 2, kv_utilization: 1}
decode:
  name: token_load_decode
  params: {expected_output_tokens: 512}
pd:
  min_uncached_tokens: 1024
  max_prefill_queue_s: 0.5
"""


def test_every_baseline_is_registered() -> None:
    assert set(policy_names()) >= {
        "round_robin",
        "least_request",
        "consistent_hash",
        "cache_aware",
        "kv_overlap",
        "llmd",
        "dynamo",
        "token_load",
        "token_load_decode",
    }
    for name in policy_names():
        cls = get_policy(name)
        assert cls.name == name
        assert cls.__module__.startswith("router.policies.")
        assert cls.__doc__ and cls.params_model.__doc__
        module_doc = __import__(cls.__module__, fromlist=["x"]).__doc__
        assert module_doc is not None
        for heading in ("Formula", "Parameters", "Example YAML"):
            assert heading in module_doc, (name, heading)


def test_deprecated_alias_warns_and_resolves() -> None:
    assert deprecated_aliases()["cacheaware"] == "cache_aware"
    with pytest.warns(DeprecationWarning, match="use 'cache_aware'"):
        assert get_policy("cacheaware") is CacheAwarePolicy
    with pytest.raises(KeyError, match="unknown policy 'nope'"):
        get_policy("nope")


def test_yaml_config_builds_policies(tmp_path: Path) -> None:
    config = load_router_config(EXAMPLE)
    assert config.pd.min_uncached_tokens == 1024
    prefill = build_policy(config.prefill)
    assert isinstance(prefill, LlmdPolicy)
    assert prefill.weights == {"prefix": 3.0, "queue": 2.0, "kv_utilization": 1.0}
    decode = build_policy(config.decode)
    assert decode.params.expected_output_tokens == 512
    path = tmp_path / "router.yaml"
    path.write_text(EXAMPLE)
    assert load_router_config(path) == config
    # Defaults: pdorch's own policies and the P/D defaults.
    default = load_router_config("")
    assert (default.prefill.name, default.decode.name) == ("token_load", "token_load_decode")
    assert default.pd.min_uncached_tokens == 512
    # Built from a plain mapping too; a deprecated alias still works.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert isinstance(build_policy({"name": "llm-d"}), LlmdPolicy)


@pytest.mark.parametrize(
    ("yaml_text", "field"),
    [
        (
            "prefill: {name: cache_aware, params: {balance_abs_threshold: -1}}",
            "prefill.params.balance_abs_threshold",
        ),
        (
            "prefill: {name: cache_aware, params: {cache_threshold: 'high'}}",
            "prefill.params.cache_threshold",
        ),
        ("prefill: {name: cache_aware, params: {balance_abs: 64}}", "prefill.params.balance_abs"),
        ("decode: {name: dynamo, params: {temperature: -0.5}}", "decode.params.temperature"),
        ("prefill: {name: llmd, weights: {latency: 1}}", "prefill.weights"),
        ("prefill: {name: llmd, weights: {prefix: heavy}}", "prefill.weights.prefix"),
        ("prefill: {name: no_such_policy}", "prefill.name"),
        ("prefill: {params: {}}", "prefill.name"),
        ("prefill: {name: llmd, wieghts: {}}", "prefill.wieghts"),
        ("pd: {min_uncached_tokens: lots}", "pd.min_uncached_tokens"),
        ("routing: {}", "routing"),
    ],
)
def test_config_errors_name_the_field(yaml_text: str, field: str) -> None:
    with pytest.raises(PolicyConfigError) as info:
        load_router_config(yaml_text)
    assert field in str(info.value)


def test_top_level_must_be_a_mapping() -> None:
    with pytest.raises(PolicyConfigError, match="mapping"):
        load_router_config("- a\n- b\n")


def test_register_a_custom_policy() -> None:
    @register("always_first_v0")
    class AlwaysFirst(Policy[NoParams]):
        """Test policy."""

        name = "always_first"

        def pick(
            self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
        ) -> PolicyDecision:
            return PolicyDecision(self.name, replicas[0].replica_id, "first")

    assert get_policy("always_first") is AlwaysFirst
    assert isinstance(build_policy({"name": "always_first"}), AlwaysFirst)
    with pytest.raises(ValueError, match="already registered"):

        @register()
        class Clash(Policy[NoParams]):
            name = "always_first"

            def pick(
                self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
            ) -> PolicyDecision:
                raise NotImplementedError
