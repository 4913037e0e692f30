"""The fleet YAML's `discovery:` section (errors name the field and line) and the pure pod →
replica mapping; the fake API server's label selectors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pdorch.config.fleet import FleetConfigError, load_fleet_config, parse_fleet_config
from pools.kubernetes.pods import (
    PORT_ANNOTATIONS,
    endpoint_of,
    pod_view,
    routable,
    side_channel_of,
)
from pools.kubernetes.settings import KubernetesDiscoverySettings
from tests.kube_objects import ApiStatusError, selector_matches

FLEET = """\
served_model_name: m
pools: {prefill: {}, decode: {}}
discovery:
  kind: kubernetes
  namespace: llm
  api_url: http://127.0.0.1:6443
  side_channel_port: 5601
  pools:
    prefill: {label_selector: "app=vllm,pdorch.io/pool=prefill", deployment: vllm-prefill}
    decode:
      label_selector: "app=vllm,pdorch.io/pool=decode"
      deployment: vllm-decode
      port: 8100
"""


def load(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return load_fleet_config(path)


def test_a_discovery_fleet_loads_without_static_replicas(tmp_path: Path) -> None:
    config = load(tmp_path, FLEET)
    d = config.discovery
    assert d is not None and d.namespace == "llm"
    assert d.pool("decode").deployment == "vllm-decode"
    assert d.port_of("decode") == 8100 and d.port_of("prefill") == 8000
    assert d.kv_events_port_of("decode") == 5557
    assert d.side_channel_port_of("prefill") == 5601
    assert d.resolved_api_url() == "http://127.0.0.1:6443"


@pytest.mark.parametrize(
    ("old", "new", "path", "line", "says"),
    [
        ("kind: kubernetes", "kind: consul", "discovery.kind", 4, "'kubernetes'"),
        (
            "side_channel_port: 5601",
            "side_channel_port: 0",
            "discovery.side_channel_port",
            7,
            "equal to 1",
        ),
        ("namespace: llm", "watch_timeout: 5", "discovery.watch_timeout", 5, "Extra inputs"),
        ("api_url: http://", "api_url: ", "discovery.api_url", 6, "http:// or https://"),
        ("port: 8100", "port: 99999", "discovery.pools.decode.port", 13, "65535"),
    ],
)
def test_discovery_errors_name_the_field_and_line(
    tmp_path: Path, old: str, new: str, path: str, line: int, says: str
) -> None:
    assert old in FLEET
    with pytest.raises(FleetConfigError) as info:
        load(tmp_path, FLEET.replace(old, new))
    issue = info.value.issues[0]
    assert (issue.path, issue.line) == (path, line), info.value
    assert says in issue.message, issue.message


def test_unknown_pool_and_missing_selector_are_named() -> None:
    base: dict[str, Any] = {"served_model_name": "m", "pools": {"prefill": {}, "decode": {}}}
    with pytest.raises(FleetConfigError) as info:
        parse_fleet_config(
            {
                **base,
                "discovery": {"kind": "kubernetes", "pools": {"mixed": {"label_selector": "a"}}},
            }
        )
    assert info.value.issues[0].path == "discovery.pools"
    assert "unknown pool 'mixed'" in info.value.issues[0].message
    with pytest.raises(FleetConfigError) as info:
        parse_fleet_config({**base, "discovery": {"kind": "kubernetes", "pools": {"decode": {}}}})
    assert info.value.issues[0].path == "discovery.pools.decode.label_selector"
    # without discovery and without replicas nothing could serve
    with pytest.raises(FleetConfigError) as info:
        parse_fleet_config(base)
    assert "discovery.pools.decode" in info.value.issues[0].message


def pod(**status: Any) -> dict[str, Any]:
    ready = status.pop("ready", True)
    return {
        "metadata": {
            "name": "vllm-decode-7f9c-abcde",
            "labels": {"pdorch.io/kv-role": status.pop("role", "kv_both")},
            "annotations": status.pop("annotations", {}),
            "resourceVersion": "42",
            **status.pop("meta", {}),
        },
        "status": {
            "podIP": status.pop("ip", "10.1.2.3"),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def settings() -> KubernetesDiscoverySettings:
    return KubernetesDiscoverySettings.model_validate(
        {
            "kind": "kubernetes",
            "kv_events_replay_port": 5558,
            "kv_events_topic": "t",
            "pools": {"decode": {"label_selector": "app=vllm"}},
        }
    )


def test_a_ready_pod_maps_to_its_http_kv_event_and_side_channel_endpoints() -> None:
    view = pod_view(pod())
    assert routable(view)
    ep = endpoint_of(view, "decode", settings(), model="m", block_size=16)
    assert ep.replica_id == "vllm-decode-7f9c-abcde" and ep.pool == "decode"
    assert ep.url == "http://10.1.2.3:8000"
    assert ep.kv_events_endpoint == "tcp://10.1.2.3:5557"
    assert ep.kv_events_replay_endpoint == "tcp://10.1.2.3:5558"
    assert ep.kv_events_topic == "t" and ep.kind == "kubernetes" and ep.switchable
    assert side_channel_of(view, "decode", settings()) == ("10.1.2.3", 5600)
    # per-pod ports from annotations; IPv6 in brackets; a producer-only pod is not switchable
    annotated = pod_view(
        pod(ip="fd00::7", role="kv_producer", annotations={PORT_ANNOTATIONS["port"]: "9000"})
    )
    ep6 = endpoint_of(annotated, "decode", settings(), model="m", block_size=16)
    assert ep6.url == "http://[fd00::7]:9000" and not ep6.switchable


def test_not_ready_terminating_or_ipless_pods_are_not_routable() -> None:
    assert not routable(pod_view(pod(ready=False)))
    assert not routable(pod_view(pod(meta={"deletionTimestamp": "2026-12-01T00:00:00Z"})))
    assert not routable(pod_view(pod(ip=None)))
    with pytest.raises(ValueError, match="no IP"):
        endpoint_of(pod_view(pod(ip=None)), "decode", settings(), model="m", block_size=16)


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("app=vllm", True),
        ("app==vllm,pool=decode", True),
        ("app=vllm,pool!=decode", False),
        ("pool in (prefill, decode)", True),
        ("pool notin (decode)", False),
        ("app", True),
        ("!gpu", True),
        ("", True),
    ],
)
def test_the_fake_servers_label_selectors(selector: str, matches: bool) -> None:
    assert selector_matches(selector, {"app": "vllm", "pool": "decode"}) is matches


def test_the_fake_server_rejects_a_selector_it_cannot_parse() -> None:
    with pytest.raises(ApiStatusError) as info:
        selector_matches("app=(x", {})
    assert info.value.code == 400
