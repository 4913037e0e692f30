"""Every object of every rendered overlay validates, offline, against the Kubernetes OpenAPI schemas
of the release the client is pinned to (`kubernetes-validate`, which bundles them; strict: an
unknown field, e.g. a misspelt `readinessProbe`, is an error, as the API server's strict field
validation makes it).

The Prometheus Operator's kinds (ServiceMonitor, PrometheusRule) are CRDs, so the core schemas do
not have them; their essential shape (what the operator's CRD requires and what pdorch relies on)
is checked by hand below."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from tests.deploy.kustomize import OVERLAYS, Object, one, render

pytestmark = pytest.mark.integration  # runs kubectl

# The Kubernetes minor version of the schemas: kubernetes==37.0.2 is the client for 1.37.
KUBERNETES_VERSION = "1.37.0"
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}
DURATION_SUFFIXES = ("ms", "s", "m", "h", "d", "w", "y")


def schema_errors(obj: Object) -> str | None:
    """None if `obj` validates strictly, else the validator's message."""
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return f"{error.message} at {list(error.path)}"
    return None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_core_object_validates_against_the_openapi_schemas(overlay: str) -> None:
    objects = [o for o in render(overlay) if o["kind"] not in OPERATOR_KINDS]
    assert len(objects) > 10  # the whole fleet rendered, not an empty list
    failures = {
        f"{o['kind']}/{o['metadata']['name']}": error
        for o in objects
        if (error := schema_errors(o)) is not None
    }
    assert failures == {}


def test_the_validator_rejects_a_misspelt_field_and_a_wrong_type() -> None:
    """The check above could fail: strict validation catches what kubectl apply would refuse."""
    coordinator = one(render("sim-cpu"), "StatefulSet", "pdorch-coordinator")
    misspelt = copy.deepcopy(coordinator)
    c = misspelt["spec"]["template"]["spec"]["containers"][0]
    c["readinessProbes"] = c.pop("readinessProbe", {})
    assert schema_errors(misspelt) is not None
    wrong_type = copy.deepcopy(coordinator)
    wrong_type["spec"]["replicas"] = "three"
    assert schema_errors(wrong_type) is not None
    assert schema_errors(coordinator) is None


def _is_duration(value: Any) -> bool:
    return isinstance(value, str) and value.endswith(DURATION_SUFFIXES) and value[0].isdigit()


def _service_monitor_problems(monitor: Object) -> list[str]:
    spec = monitor.get("spec", {})
    problems = []
    if not isinstance(spec.get("selector"), dict):
        problems.append("spec.selector must be a label selector")
    endpoints = spec.get("endpoints")
    if not isinstance(endpoints, list) or not endpoints:
        problems.append("spec.endpoints must be a non-empty list")
        return problems
    for i, endpoint in enumerate(endpoints):
        if "port" not in endpoint and "targetPort" not in endpoint:
            problems.append(f"endpoints[{i}] names no port")
        if "interval" in endpoint and not _is_duration(endpoint["interval"]):
            problems.append(f"endpoints[{i}].interval is not a duration")
        if not str(endpoint.get("path", "/metrics")).startswith("/"):
            problems.append(f"endpoints[{i}].path is not absolute")
    return problems


def _prometheus_rule_problems(rule: Object) -> list[str]:
    groups = rule.get("spec", {}).get("groups")
    if not isinstance(groups, list) or not groups:
        return ["spec.groups must be a non-empty list"]
    problems = []
    for group in groups:
        if not group.get("name") or not isinstance(group.get("rules"), list):
            problems.append(f"group {group.get('name')!r} needs a name and a rules list")
            continue
        for r in group["rules"]:
            # The CRD: each rule has an expr and exactly one of alert / record.
            if not isinstance(r.get("expr"), str) or ("alert" in r) == ("record" in r):
                problems.append(f"rule {r.get('alert') or r.get('record')!r}: expr + alert|record")
            if "for" in r and not _is_duration(r["for"]):
                problems.append(f"rule {r.get('alert')!r}: `for` is not a duration")
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_prometheus_operator_objects_have_the_crds_shape(overlay: str) -> None:
    operator = [o for o in render(overlay) if o["kind"] in OPERATOR_KINDS]
    assert {o["kind"] for o in operator} == OPERATOR_KINDS
    for o in operator:
        assert o["apiVersion"] == "monitoring.coreos.com/v1"
        check = (
            _service_monitor_problems
            if o["kind"] == "ServiceMonitor"
            else _prometheus_rule_problems
        )
        assert check(o) == [], f"{o['kind']}/{o['metadata']['name']}"
