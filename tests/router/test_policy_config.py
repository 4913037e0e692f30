"""Router config from YAML: shipped profiles, parts registry, adjustments, errors that name
the field, fleet files and `router:` sections."""

from __future__ import annotations

import importlib
import random
import warnings
from collections.abc import Sequence
from pathlib import Path

import pytest

from router.plugins.base import NoParams, Scorer, ScorerOutput
from router.plugins.registry import get_part, part_names, register
from router.plugins.spec import deprecated_aliases, get_profile_spec, profile_names
from router.policies.config import PolicyConfigError, build_policy, load_router_config
from router.replica_state import ReplicaSnapshot, RoutingRequest

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

NINE = {
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


def test_every_policy_is_a_shipped_profile_of_documented_parts() -> None:
    assert set(profile_names()) >= NINE
    for name in profile_names():
        spec = get_profile_spec(name)
        assert spec.name == name and spec.description
        profile = build_policy({"name": name})
        assert profile.name == name
    for kind in ("filter", "scorer", "picker"):
        for name in part_names(kind):
            cls = get_part(kind, name)
            assert cls.name == name and cls.__doc__ and cls.params_model.__doc__
            doc = importlib.import_module(cls.__module__).__doc__
            assert doc is not None and "Example" in doc, (kind, name)
            if cls.params_model is not NoParams:
                assert "Parameters (defaults" in doc, (kind, name)
                for field in cls.params_model.model_fields:
                    assert f"`{field}`" in doc, (kind, name, field)


def test_deprecated_alias_warns_and_resolves() -> None:
    assert deprecated_aliases()["cacheaware"] == "cache_aware"
    with pytest.warns(DeprecationWarning, match="use 'cache_aware'"):
        assert get_profile_spec("cacheaware").name == "cache_aware"
    with pytest.warns(DeprecationWarning):
        assert build_policy({"name": "llm-d"}).name == "llmd"
    with pytest.raises(KeyError, match="unknown policy 'nope'"):
        get_profile_spec("nope")


def test_yaml_config_builds_profiles(tmp_path: Path) -> None:
    config = load_router_config(EXAMPLE)
    assert config.pd.min_uncached_tokens == 1024
    prefill = build_policy(config.prefill)
    assert prefill.weights == {"prefix": 3.0, "queue": 2.0, "kv_utilization": 1.0}
    decode = build_policy(config.decode)
    # `params` reach every part that takes the key: the headroom filter and the scorer.
    takers = [p for p in (*decode.filters, *(s for s, _ in decode.scorers)) if p.name != "health"]
    assert [p.params.expected_output_tokens for p in takers] == [512, 512]
    path = tmp_path / "router.yaml"
    path.write_text(EXAMPLE)
    assert load_router_config(path) == config
    default = load_router_config("")
    assert (default.prefill.name, default.decode.name) == ("token_load", "token_load_decode")
    assert default.pd.min_uncached_tokens == 512


def test_router_section() -> None:
    nested = "router:\n" + "\n".join("  " + line for line in EXAMPLE.splitlines())
    assert load_router_config(nested) == load_router_config(EXAMPLE)


def test_inline_profile_mixes_parts() -> None:
    config = load_router_config(
        """
prefill:
  name: prefix_then_load
  scorers: [{name: prefix, weight: 1}, {name: token_load, weight: 10}]
"""
    )
    profile = build_policy(config.prefill)
    assert [f.name for f in profile.filters] == ["health"] and profile.picker.name == "max_score"
    req = RoutingRequest("r", prompt_tokens=1600, block_keys=tuple(range(100)))
    # b holds the prompt but is 2 s behind; the token_load term reads the other way (-10 * t).
    snaps = [
        ReplicaSnapshot("a"),
        ReplicaSnapshot("b", overlap_blocks=100, prefill_tokens_queued=20_000),
    ]
    decision = profile.pick(req, snaps, 0.0)
    assert decision.chosen == "a" and decision.higher_is_better
    assert decision.scores["a"] == pytest.approx(-10 * 0.16)
    assert decision.scores["b"] == pytest.approx(1.0 - 10 * 2.0)
    # A shipped profile with one section replaced keeps the rest.
    sampled = build_policy(
        {"name": "dynamo", "picker": {"name": "softmax", "params": {"temperature": 1.0}}},
        rng=random.Random(1),
    )
    assert [s.name for s, _ in sampled.scorers] == ["dynamo_cost"]


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
        ("prefill: {name: consistent_hash, params: {fallback: nope}}", "prefill.params.fallback"),
        ("prefill: {name: mine, scorers: [{name: nope}]}", "prefill.scorers.0.name"),
        (
            "prefill: {name: mine, scorers: [{name: prefix, params: {unit: x}}]}",
            "scorers.0.params.unit",
        ),
        ("prefill: {name: mine, scorers: []}", "prefill.scorers"),
        (
            "prefill: {name: mine, scorers: [{name: queue}], picker: {name: no}}",
            "prefill.picker.name",
        ),
        (
            "prefill: {name: mine, scorers: [{name: queue}], picker: {name: cache_aware}}",
            "prefill.picker",
        ),
        (
            "decode: {name: dynamo, picker: {name: max_score, params: {tie_break: [x]}}}",
            "tie_break",
        ),
        ("router: [1]", "router"),
    ],
)
def test_config_errors_name_the_field(yaml_text: str, field: str) -> None:
    with pytest.raises(PolicyConfigError) as info:
        load_router_config(yaml_text)
    assert field in str(info.value)


def test_top_level_must_be_a_mapping() -> None:
    with pytest.raises(PolicyConfigError, match="mapping"):
        load_router_config("- a\n- b\n")


def test_register_a_custom_scorer() -> None:
    @register
    class LowestId(Scorer[NoParams]):
        """Test scorer: prefers ids early in the alphabet."""

        name = "test_lowest_id"
        higher_is_better = False

        def score(
            self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
        ) -> ScorerOutput:
            return ScorerOutput({r.replica_id: float(ord(r.replica_id[0])) for r in candidates})

    profile = build_policy({"name": "abc", "scorers": [{"name": "test_lowest_id"}]})
    decision = profile.pick(
        RoutingRequest("r", 16), [ReplicaSnapshot("z"), ReplicaSnapshot("b")], 0
    )
    assert decision.chosen == "b" and not decision.higher_is_better
    with pytest.raises(ValueError, match="already registered"):

        @register
        class Clash(Scorer[NoParams]):
            name = "test_lowest_id"

            def score(
                self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot], now: float
            ) -> ScorerOutput:
                raise NotImplementedError

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_policy({"name": "token_load"})  # a current name does not warn
