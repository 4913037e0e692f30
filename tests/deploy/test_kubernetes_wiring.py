"""deploy/kubernetes: RBAC grants nothing beyond its list; the fleet ConfigMap, ports, peers,
drain settings, scrape targets, admin Secret references and SLO alerts agree with each other and
with the SLO policy."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscale.policy import load_policy
from pdorch.config.fleet import CoordinatorSettings
from pdorch.sync.settings import SyncSettings
from pools.k8s_render import load_engines
from tests.deploy.kustomize import (
    KUBERNETES,
    NAMESPACE,
    OVERLAYS,
    OVERLAYS_DIR,
    POOLS,
    REPO,
    VLLM_OVERLAYS,
    Object,
    configmap_file,
    container,
    env_values,
    find,
    one,
    ports,
    render,
)

pytestmark = pytest.mark.integration  # runs kubectl

# ---- RBAC: exactly these grants per ServiceAccount, nothing else ---------------------------------

SCALED = ("pdorch-decode", "pdorch-prefill")
ROLES = {
    # discovery: read-only on pods (tests/deploy/test_kubernetes_runtime.py checks the calls)
    "pdorch-coordinator": {
        ("", "pods", "get", ()),
        ("", "pods", "list", ()),
        ("", "pods", "watch", ()),
    },
    # the Kubernetes actuator in `pdorch autoscale --actuator kubernetes`
    "pdorch-autoscaler": {
        ("", "pods", "get", ()),
        ("", "pods", "list", ()),
        ("", "pods", "watch", ()),
        ("", "pods", "patch", ()),
        ("apps", "deployments/scale", "get", SCALED),
        ("apps", "deployments/scale", "patch", SCALED),
    },
}


def grants(role: Object) -> set[tuple[str, str, str, tuple[str, ...]]]:
    grants = set()
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, rule
        names = tuple(sorted(rule.get("resourceNames", ())))
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    grants.add((group, resource, verb, names))
    return grants


def _pod_specs(objects: list[Object]) -> dict[str, Object]:
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in objects
        if o["kind"] in ("Deployment", "StatefulSet")
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_grants_nothing_beyond_the_list(overlay: str) -> None:
    objects = render(overlay)
    assert not find(objects, "ClusterRole") and not find(objects, "ClusterRoleBinding")
    roles = {r["metadata"]["name"]: r for r in find(objects, "Role")}
    assert set(roles) == set(ROLES)
    for name, role in roles.items():
        assert grants(role) == ROLES[name], name
        assert "*" not in str(role["rules"])
    bindings = {b["metadata"]["name"]: b for b in find(objects, "RoleBinding")}
    assert set(bindings) == set(ROLES)
    for name, binding in bindings.items():
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": name,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}
        ]
    accounts = {a["metadata"]["name"] for a in find(objects, "ServiceAccount")}
    assert accounts == set(ROLES)
    # the scale grant names exactly the engine Deployments there are
    deployments = {o["metadata"]["name"] for o in find(objects, "Deployment")}
    assert set(SCALED) <= deployments
    # the coordinators and the autoscaler run with their own account; engines have no token
    for name, spec in _pod_specs(objects).items():
        if name in ROLES:
            assert spec["serviceAccountName"] == name
            assert spec.get("automountServiceAccountToken", True) is True, name
        else:
            assert "serviceAccountName" not in spec, name
            assert spec["automountServiceAccountToken"] is False, name


# ---- the pieces agree: fleet file, ports, coordinators, drain, SLO alerts ------------------------


def _fleet(objects: list[Object]) -> dict[str, Any]:
    fleet: dict[str, Any] = yaml.safe_load(configmap_file(objects, "pdorch-fleet", "fleet.yaml"))
    return fleet


# the runtime's shape (pools/kubernetes/settings.py); test_kubernetes_runtime.py loads it
DISCOVERY_KEYS = {
    "kind",
    "namespace",
    "port",
    "kv_events_port",
    "kv_events_replay_port",
    "kv_events_topic",
    "side_channel_port",
    "pools",
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_fleet_file_matches_the_engine_pods(overlay: str) -> None:
    objects = render(overlay)
    fleet = _fleet(objects)
    engines = load_engines(OVERLAYS_DIR / overlay)
    assert fleet["served_model_name"] == engines.served_model_name
    assert fleet["block_size"] == engines.block_size
    discovery = fleet["discovery"]
    assert set(discovery) == DISCOVERY_KEYS
    assert discovery["kind"] == "kubernetes"
    assert discovery["namespace"] == NAMESPACE
    assert set(discovery["pools"]) == set(POOLS)
    pod = engines.pod
    for pool in POOLS:
        deployment = one(objects, "Deployment", f"pdorch-{pool}")
        assert discovery["pools"][pool] == {
            "label_selector": discovery["pools"][pool]["label_selector"],
            "deployment": deployment["metadata"]["name"],
        }
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        terms = discovery["pools"][pool]["label_selector"].split(",")
        selector = dict(term.split("=", 1) for term in terms)
        assert selector.items() <= labels.items(), pool
        other = one(objects, "Deployment", f"pdorch-{'decode' if pool == 'prefill' else 'prefill'}")
        assert not selector.items() <= other["spec"]["template"]["metadata"]["labels"].items()
        c = container(deployment, pod.container)
        assert ports(c) == {
            "http": discovery["port"],
            "kv-events": discovery["kv_events_port"],
            "kv-replay": discovery["kv_events_replay_port"],
            "nixl": discovery["side_channel_port"],
        }
        assert ports(c) == {
            "http": pod.http_port,
            "kv-events": pod.kv_events_port,
            "kv-replay": pod.kv_events_replay_port,
            "nixl": pod.side_channel_port,
        }
    assert discovery["kv_events_topic"] == pod.kv_events_topic
    # what exists today validates as it is
    coordinator = dict(fleet["coordinator"], admin_token="0123abcd")
    assert CoordinatorSettings.model_validate(coordinator).host == "0.0.0.0"
    assert fleet["coordinator"]["admin_token"] == "@PDORCH_ADMIN_TOKEN@"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_two_coordinators_peer_over_stable_names(overlay: str) -> None:
    objects = render(overlay)
    sync = SyncSettings.model_validate(_fleet(objects)["sync"])
    coordinators = one(objects, "StatefulSet", "pdorch-coordinator")
    peers_service = one(objects, "Service", coordinators["spec"]["serviceName"])
    assert peers_service["spec"]["clusterIP"] == "None"
    assert peers_service["spec"]["publishNotReadyAddresses"] is True
    sync_port = ports(container(coordinators, "coordinator"))["sync"]
    replicas = coordinators["spec"]["replicas"]
    assert replicas == 2
    name, service = coordinators["metadata"]["name"], peers_service["metadata"]["name"]
    assert sync.peers == [f"tcp://{name}-{i}.{service}:{sync_port}" for i in range(replicas)]
    assert sync.bind == f"tcp://0.0.0.0:{sync_port}"
    pdb = one(objects, "PodDisruptionBudget", "pdorch-coordinator")
    assert pdb["spec"]["minAvailable"] == 1
    # the autoscaler and the engines' preStop reach the coordinators by the same names
    autoscaler = container(one(objects, "Deployment", "pdorch-autoscaler"), "autoscaler")
    command = autoscaler["command"]
    url = command[command.index("--url") + 1]
    assert url == f"http://{name}-0.{service}:8000"
    # it scales through the Kubernetes actuator and drains a pod through every coordinator
    assert command[command.index("--actuator") + 1] == "kubernetes"
    assert command[command.index("--drain-url") + 1].split(",") == [
        f"http://{name}-{i}.{service}:8000" for i in range(replicas)
    ]
    for pool in POOLS:
        c = container(one(objects, "Deployment", f"pdorch-{pool}"), "engine")
        assert env_values(c)["PDORCH_COORDINATORS"].split(",") == [
            f"http://{name}-{i}.{service}:8000" for i in range(replicas)
        ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_engines_drain_before_they_stop(overlay: str) -> None:
    objects = render(overlay)
    hook = (KUBERNETES / "base" / "engine-prestop.py").read_text()
    assert configmap_file(objects, "pdorch-engine-prestop", "engine-prestop.py") == hook
    for pool in POOLS:
        deployment = one(objects, "Deployment", f"pdorch-{pool}")
        spec = deployment["spec"]["template"]["spec"]
        c = container(deployment, "engine")
        command = c["lifecycle"]["preStop"]["exec"]["command"]
        mount = next(m for m in c["volumeMounts"] if m["name"] == "prestop")
        assert command == ["python3", f"{mount['mountPath']}/engine-prestop.py"]
        env = env_values(c)
        assert env["PDORCH_POOL"] == pool
        assert int(env["PDORCH_DRAIN_TIMEOUT_S"]) + 10 <= spec["terminationGracePeriodSeconds"]
        names = {e["name"] for e in c["env"]}
        assert {"POD_NAME", "PDORCH_ADMIN_TOKEN", "PDORCH_COORDINATORS"} <= names
        assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_gpu_engines_request_gpus_and_sim_engines_none() -> None:
    for overlay in VLLM_OVERLAYS:
        for pool in POOLS:
            c = container(one(render(overlay), "Deployment", f"pdorch-{pool}"), "engine")
            assert c["resources"]["requests"]["nvidia.com/gpu"] == "1"
            assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    for pool in POOLS:
        c = container(one(render("sim-cpu"), "Deployment", f"pdorch-{pool}"), "engine")
        assert "nvidia.com/gpu" not in str(c["resources"])


SLO_POLICY = KUBERNETES / "base" / "slo-policy.yaml"


def _alert_threshold(objects: list[Object], alert: str) -> float:
    rule = one(objects, "PrometheusRule", "pdorch-slo")
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            if r.get("alert") == alert:
                match = re.search(r">\s*([0-9.]+)\s*$", r["expr"].strip())
                assert match, r["expr"]
                return float(match.group(1))
    raise AssertionError(f"no alert {alert}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_slo_alerts_use_the_policys_targets(overlay: str) -> None:
    objects = render(overlay)
    policy = load_policy(SLO_POLICY)
    assert _alert_threshold(objects, "PdorchTTFTAboveSLO") == policy.slo.ttft_ms.target / 1000
    assert _alert_threshold(objects, "PdorchITLAboveSLO") == policy.slo.itl_ms.target / 1000
    assert configmap_file(objects, "pdorch-slo-policy", "slo-policy.yaml") == SLO_POLICY.read_text()


def test_the_deployed_slo_policy_is_the_example() -> None:
    """kustomize cannot read files outside its folder, so base/ holds a copy; keep it one."""
    assert (
        SLO_POLICY.read_bytes() == (REPO / "deploy" / "examples" / "slo-policy.yaml").read_bytes()
    )


def _servicemonitor_targets(objects: list[Object]) -> dict[str, list[str]]:
    """ServiceMonitor name → the Services it selects."""
    services = find(objects, "Service")
    selected: dict[str, list[str]] = {}
    for monitor in find(objects, "ServiceMonitor"):
        wanted = monitor["spec"]["selector"]["matchLabels"].items()
        selected[monitor["metadata"]["name"]] = [
            s["metadata"]["name"]
            for s in services
            if wanted <= s["metadata"].get("labels", {}).items()
        ]
    return selected


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_is_scraped_once(overlay: str) -> None:
    objects = render(overlay)
    assert _servicemonitor_targets(objects) == {
        "pdorch-coordinator": ["pdorch-coordinator-peers"],
        "pdorch-engines": ["pdorch-engines"],
    }


def test_engines_yaml_is_read_relative_to_the_overlay(tmp_path: Path) -> None:
    """`load_engines` takes the overlay folder or the file itself."""
    source = OVERLAYS_DIR / "vllm-gpu" / "engines.yaml"
    (tmp_path / "engines.yaml").write_text(source.read_text())
    assert load_engines(tmp_path) == load_engines(source)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_reads_the_admin_token_from_the_one_secret(overlay: str) -> None:
    objects = render(overlay)
    assert not find(objects, "Secret")
    readers = set()
    for name, spec in _pod_specs(objects).items():
        for c in spec["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    assert e["name"] == "PDORCH_ADMIN_TOKEN"
                    assert ref == {"name": "pdorch-admin", "key": "token"}
                    readers.add(name)
    assert readers == {"pdorch-coordinator", "pdorch-autoscaler", "pdorch-prefill", "pdorch-decode"}
