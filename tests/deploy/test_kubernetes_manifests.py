"""deploy/kubernetes: every overlay renders with `kubectl kustomize`; the engines' command line is
the local launcher's for the same spec (the golden test); RBAC grants nothing beyond its list;
the ConfigMaps, ports, alerts and the SLO policy agree with each other."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from autoscale.policy import load_policy
from pdorch.config.fleet import CoordinatorSettings
from pdorch.sync.settings import SyncSettings
from pools.k8s_render import load_engines, render_overlay
from pools.launch import sim_cli_args
from pools.launch_spec import SimLaunchSpec, VllmLaunchSpec
from pools.roles import EngineRole
from tests.data import VLLM_FIXTURES, require_file
from tests.deploy.kustomize import (
    KUBERNETES,
    NAMESPACE,
    OVERLAYS,
    OVERLAYS_DIR,
    REPO,
    Object,
    container,
    env_values,
    find,
    one,
    ports,
    render,
)
from tests.ports import free_port

pytestmark = pytest.mark.integration  # runs kubectl

POOLS = ("prefill", "decode")
CLUSTER_SCOPED = {"Namespace"}


def test_the_overlays_are_the_documented_ones() -> None:
    assert OVERLAYS == ["sim-cpu", "vllm-gpu", "vllm-gpu-kv-both"]


def _unhashed(o: Object) -> str:
    """The name without the content-hash suffix kustomize gives generated ConfigMaps."""
    name: str = o["metadata"]["name"]
    return re.sub(r"-[a-z0-9]{10}$", "", name) if o["kind"] == "ConfigMap" else name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_the_whole_fleet_in_one_namespace(overlay: str) -> None:
    objects = render(overlay)
    kinds = sorted((o["kind"], _unhashed(o)) for o in objects)
    expected = [
        ("ConfigMap", "pdorch-engine-prestop"),
        ("ConfigMap", "pdorch-fleet"),
        ("ConfigMap", "pdorch-slo-policy"),
        ("Deployment", "pdorch-autoscaler"),
        ("Deployment", "pdorch-decode"),
        ("Deployment", "pdorch-prefill"),
        ("Namespace", "pdorch"),
        ("PodDisruptionBudget", "pdorch-coordinator"),
        ("PodDisruptionBudget", "pdorch-decode"),
        ("PodDisruptionBudget", "pdorch-prefill"),
        ("PrometheusRule", "pdorch-slo"),
        ("Role", "pdorch-coordinator"),
        ("RoleBinding", "pdorch-coordinator"),
        ("Service", "pdorch"),
        ("Service", "pdorch-coordinator-peers"),
        ("Service", "pdorch-engines"),
        ("ServiceAccount", "pdorch-coordinator"),
        ("ServiceMonitor", "pdorch-coordinator"),
        ("ServiceMonitor", "pdorch-engines"),
        ("StatefulSet", "pdorch-coordinator"),
    ]
    if overlay.startswith("vllm-gpu"):
        expected.append(("PersistentVolumeClaim", "pdorch-models"))
    assert kinds == sorted(expected)  # no Secret: the admin token is never in the repository
    for o in objects:
        if o["kind"] not in CLUSTER_SCOPED:
            assert o["metadata"].get("namespace") == NAMESPACE, o["metadata"]["name"]


# ---- the golden test: the pods' vLLM command line is the local launcher's ----------------------


def _launcher_spec_for_pod(overlay: str, pool: str, c: Object) -> tuple[Any, list[str]]:
    """The engine spec the local launcher builds (`VllmLaunchSpec.engine_spec`, as
    `pools.launch._Vllm.start` calls it) for the pod's ports, and its `argv`."""
    engines = load_engines(OVERLAYS_DIR / overlay)
    launch = getattr(engines, pool)
    assert isinstance(launch, VllmLaunchSpec)
    p = ports(c)
    spec = launch.engine_spec(
        role=EngineRole(pool),
        port=p["http"],
        side_channel_port=p["nixl"],
        served_model_name=engines.served_model_name,
        block_size=engines.block_size,
        kv_events_endpoint=f"tcp://*:{p['kv-events']}",
        kv_events_replay_endpoint=f"tcp://*:{p['kv-replay']}",
        kv_events_topic=engines.pod.kv_events_topic,
    )
    return spec, spec.argv(engines.python)


VLLM_OVERLAYS = [o for o in OVERLAYS if o.startswith("vllm-")]


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("overlay", VLLM_OVERLAYS)
def test_vllm_pod_command_and_env_are_the_local_launchers(overlay: str, pool: str) -> None:
    deployment = one(render(overlay), "Deployment", f"pdorch-{pool}")
    c = container(deployment, "engine")
    spec, argv = _launcher_spec_for_pod(overlay, pool, c)
    assert c["command"] == argv
    assert "args" not in c
    env = env_values(c)
    for name, value in spec.env({}).items():
        assert env[name] == value, name
    # $(POD_IP) only expands when POD_IP is defined earlier in the list
    names = [e["name"] for e in c["env"]]
    assert c["env"][0] == {
        "name": "POD_IP",
        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
    }
    for e in c["env"]:
        for ref in re.findall(r"\$\((\w+)\)", e.get("value", "")):
            assert names.index(ref) < names.index(e["name"]), e
    for ref in re.findall(r"\$\((\w+)\)", " ".join(c["command"])):
        assert ref in names


GOLDEN_PREFILL = [
    "python3",
    "-m",
    "vllm.entrypoints.openai.api_server",
    "--model",
    "/models/Llama-3.1-8B-Instruct",
    "--served-model-name",
    "llama-3.1-8b",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    "--dtype",
    "bfloat16",
    "--max-model-len",
    "8192",
    "--block-size",
    "16",
    "--enable-prefix-caching",
    "--prefix-caching-hash-algo",
    "sha256_cbor",
    "--kv-transfer-config",
    '{"kv_buffer_device":"cuda","kv_connector":"NixlConnector",'
    '"kv_load_failure_policy":"fail","kv_role":"kv_producer"}',
    "--kv-events-config",
    '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557",'
    '"topic":"kv-events","replay_endpoint":"tcp://*:5558"}',
]


def test_vllm_gpu_prefill_command_is_the_golden_one() -> None:
    """A literal copy: a change in the generator shows here even if both sides moved."""
    c = container(one(render("vllm-gpu"), "Deployment", "pdorch-prefill"), "engine")
    assert c["command"] == GOLDEN_PREFILL
    env = env_values(c)
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "$(POD_IP)"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert env["VLLM_HOST_IP"] == "$(POD_IP)"
    assert "UCX_TLS" not in env  # GPU hosts: UCX picks RDMA/NVLink itself


def _kv_role(c: Object) -> str:
    config = c["command"][c["command"].index("--kv-transfer-config") + 1]
    role: str = yaml.safe_load(config)["kv_role"]
    return role


def test_kv_roles_per_overlay() -> None:
    gpu = render("vllm-gpu")
    assert _kv_role(container(one(gpu, "Deployment", "pdorch-prefill"), "engine")) == "kv_producer"
    assert _kv_role(container(one(gpu, "Deployment", "pdorch-decode"), "engine")) == "kv_consumer"
    both = render("vllm-gpu-kv-both")
    for pool in POOLS:
        deployment = one(both, "Deployment", f"pdorch-{pool}")
        assert _kv_role(container(deployment, "engine")) == "kv_both"
        assert (
            deployment["spec"]["template"]["metadata"]["labels"]["pdorch.io/switchable"] == "true"
        )
        assert (
            "pdorch.io/switchable"
            not in (
                one(gpu, "Deployment", f"pdorch-{pool}")["spec"]["template"]["metadata"]["labels"]
            )
        )


@pytest.mark.parametrize("pool", POOLS)
def test_sim_pod_command_is_the_local_launchers(pool: str) -> None:
    c = container(one(render("sim-cpu"), "Deployment", f"pdorch-{pool}"), "engine")
    engines = load_engines(OVERLAYS_DIR / "sim-cpu")
    launch = getattr(engines, pool)
    assert isinstance(launch, SimLaunchSpec)
    p = ports(c)
    flags = sim_cli_args(
        launch,
        role=EngineRole(pool),
        served_model_name=engines.served_model_name,
        block_size=engines.block_size,
        kv_events_endpoint=f"tcp://*:{p['kv-events']}",
        kv_events_replay_endpoint=f"tcp://*:{p['kv-replay']}",
        kv_events_topic=engines.pod.kv_events_topic,
    )
    # the launcher asks for port 0 (any free one); a pod has fixed ports
    flags[flags.index("--port") + 1] = str(p["http"])
    flags[flags.index("--side-channel-port") + 1] = str(p["nixl"])
    assert c["command"] == ["pdorch", "engine", "sim", *flags]
    assert (
        c["image"]
        == container(one(render("sim-cpu"), "StatefulSet", "pdorch-coordinator"), "coordinator")[
            "image"
        ]
    )


@pytest.mark.parametrize(
    "overlay", [o for o in OVERLAYS if (OVERLAYS_DIR / o / "engines.yaml").exists()]
)
def test_generated_patches_are_current(overlay: str) -> None:
    for path, text in render_overlay(OVERLAYS_DIR / overlay).items():
        assert path.read_text() == text, (
            f"{path.relative_to(REPO)} is stale: python -m pools.k8s_render {path.parent}"
        )


# ---- RBAC: exactly the grants listed in the task, nothing else -----------------------------------

ALLOWED_RULES = {
    ("", "pods", "get", ()),
    ("", "pods", "list", ()),
    ("", "pods", "watch", ()),
    ("", "pods", "patch", ()),
    ("discovery.k8s.io", "endpointslices", "get", ()),
    ("discovery.k8s.io", "endpointslices", "list", ()),
    ("discovery.k8s.io", "endpointslices", "watch", ()),
    ("apps", "deployments/scale", "get", ("pdorch-decode", "pdorch-prefill")),
    ("apps", "deployments/scale", "patch", ("pdorch-decode", "pdorch-prefill")),
}


def _grants(role: Object) -> set[tuple[str, str, str, tuple[str, ...]]]:
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
    roles = find(objects, "Role")
    assert len(roles) == 1
    assert _grants(roles[0]) == ALLOWED_RULES
    assert "*" not in str(roles[0]["rules"])
    (binding,) = find(objects, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "pdorch-coordinator",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "pdorch-coordinator", "namespace": NAMESPACE}
    ]
    # the scale grant names exactly the engine Deployments there are
    deployments = {o["metadata"]["name"] for o in find(objects, "Deployment")}
    assert {"pdorch-prefill", "pdorch-decode"} <= deployments
    # only the coordinators run with that account; every other pod has no API token
    for name, spec in _pod_specs(objects).items():
        if name == "pdorch-coordinator":
            assert spec["serviceAccountName"] == "pdorch-coordinator"
        else:
            assert "serviceAccountName" not in spec, name
            assert spec["automountServiceAccountToken"] is False, name


# ---- the pieces agree: fleet file, ports, coordinators, drain, SLO alerts ------------------------


def _configmap_file(objects: list[Object], name: str, key: str) -> str:
    text: str = one(objects, "ConfigMap", name)["data"][key]
    return text


def _fleet(objects: list[Object]) -> dict[str, Any]:
    fleet: dict[str, Any] = yaml.safe_load(_configmap_file(objects, "pdorch-fleet", "fleet.yaml"))
    return fleet


DISCOVERY_KEYS = {"kind", "namespace", "label_selector", "ports"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_fleet_file_matches_the_engine_pods(overlay: str) -> None:
    objects = render(overlay)
    fleet = _fleet(objects)
    engines = load_engines(OVERLAYS_DIR / overlay)
    assert fleet["served_model_name"] == engines.served_model_name
    assert fleet["block_size"] == engines.block_size
    discovery = fleet["discovery"]
    assert set(discovery) == DISCOVERY_KEYS  # the shape agreed with the discovery's config
    assert discovery["kind"] == "kubernetes"
    assert discovery["namespace"] == NAMESPACE
    assert set(discovery["label_selector"]) == set(POOLS)
    pod = engines.pod
    for pool in POOLS:
        deployment = one(objects, "Deployment", f"pdorch-{pool}")
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        selector = dict(term.split("=", 1) for term in discovery["label_selector"][pool].split(","))
        assert selector.items() <= labels.items(), pool
        other = one(objects, "Deployment", f"pdorch-{'decode' if pool == 'prefill' else 'prefill'}")
        assert not selector.items() <= other["spec"]["template"]["metadata"]["labels"].items()
        c = container(deployment, pod.container)
        assert ports(c) == {
            "http": discovery["ports"]["http"],
            "kv-events": discovery["ports"]["kv_events"],
            "kv-replay": discovery["ports"]["kv_events_replay"],
            "nixl": discovery["ports"]["side_channel"],
        }
        assert ports(c) == {
            "http": pod.http_port,
            "kv-events": pod.kv_events_port,
            "kv-replay": pod.kv_events_replay_port,
            "nixl": pod.side_channel_port,
        }
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
    url = autoscaler["command"][autoscaler["command"].index("--url") + 1]
    assert url == f"http://{name}-0.{service}:8000"
    for pool in POOLS:
        c = container(one(objects, "Deployment", f"pdorch-{pool}"), "engine")
        assert env_values(c)["PDORCH_COORDINATORS"].split(",") == [
            f"http://{name}-{i}.{service}:8000" for i in range(replicas)
        ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_engines_drain_before_they_stop(overlay: str) -> None:
    objects = render(overlay)
    hook = (KUBERNETES / "base" / "engine-prestop.py").read_text()
    assert _configmap_file(objects, "pdorch-engine-prestop", "engine-prestop.py") == hook
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
    assert (
        _configmap_file(objects, "pdorch-slo-policy", "slo-policy.yaml") == SLO_POLICY.read_text()
    )


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


BUSY_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def _local(command: list[str], replace: dict[str, str]) -> list[str]:
    """The pod's command for this machine: pdorch from this tree, the pod's values swapped."""
    out = [replace.get(arg, arg).replace("$(POD_IP)", "127.0.0.1") for arg in command[1:]]
    return [sys.executable, "-c", "from pdorch.cli import main; main()", *out]


def test_the_rendered_sim_engine_command_starts_a_working_engine(tmp_path: Path) -> None:
    """The sim-cpu pod's command line runs (ports swapped for free ones: tests share the
    machine) and serves what the coordinator and the preStop hook read."""
    c = container(one(render("sim-cpu"), "Deployment", "pdorch-decode"), "engine")
    port, side, events, replay = (free_port() for _ in range(4))
    command = _local(
        c["command"],
        {
            "8000": str(port),
            "5600": str(side),
            "tcp://*:5557": f"tcp://127.0.0.1:{events}",
            "tcp://*:5558": f"tcp://127.0.0.1:{replay}",
        },
    )
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "engine.log").open("wb"),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, (tmp_path / "engine.log").read_text()
        line = process.stdout.readline().decode().strip()
        assert line == f"ready http://127.0.0.1:{port}", (tmp_path / "engine.log").read_text()
        url = line.split()[1]
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        models = httpx.get(f"{url}/v1/models", timeout=5).json()["data"]
        assert [m["id"] for m in models] == [
            load_engines(OVERLAYS_DIR / "sim-cpu").served_model_name
        ]
        metrics = httpx.get(f"{url}/metrics", timeout=5).text
        for gauge in BUSY_GAUGES:  # what the preStop hook waits on
            assert f"\n{gauge}" in metrics, gauge
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_the_prestop_hook_reads_gauges_vllm_exports() -> None:
    capture = require_file(VLLM_FIXTURES / "metrics_single.txt").read_text()
    hook = (KUBERNETES / "base" / "engine-prestop.py").read_text()
    for gauge in BUSY_GAUGES:
        assert f'"{gauge}"' in hook
        assert f"\n{gauge}" in capture, gauge


def _start_script(tmp_path: Path, token: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the coordinator container's start script with its paths moved under `tmp_path` and
    no `pdorch` on PATH (the script's last step, `exec pdorch serve`, then fails with 127)."""
    objects = render("vllm-gpu")
    c = container(one(objects, "StatefulSet", "pdorch-coordinator"), "coordinator")
    assert c["command"] == ["/bin/sh", "-c"]
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    run.mkdir()
    (etc / "fleet.yaml").write_text(_configmap_file(objects, "pdorch-fleet", "fleet.yaml"))
    script = c["args"][0].replace("/etc/pdorch/fleet", str(etc)).replace("/run/pdorch", str(run))
    done = subprocess.run(
        ["/bin/sh", "-c", script],
        env={"PATH": "/usr/bin:/bin", "PDORCH_ADMIN_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done, run / "fleet.yaml"


def test_coordinator_start_script_writes_the_token_into_a_private_fleet_file(
    tmp_path: Path,
) -> None:
    done, fleet = _start_script(tmp_path, "0123abcdef.x_y-z")
    assert done.returncode == 127, done.stderr  # got as far as `exec pdorch`
    assert "pdorch" in done.stderr
    assert yaml.safe_load(fleet.read_text())["coordinator"]["admin_token"] == "0123abcdef.x_y-z"
    assert fleet.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("token", ["", "a/b", "a b", "x&y", "tok'en"])
def test_coordinator_start_script_refuses_tokens_sed_would_mangle(
    tmp_path: Path, token: str
) -> None:
    done, fleet = _start_script(tmp_path, token)
    assert done.returncode == 1
    assert "token must be" in done.stderr
    assert not fleet.exists()


def _dropped(original: Any, loaded: Any, path: str = "") -> list[str]:
    """Paths of `original` that did not survive a load into the client's models and back
    (the models drop fields they do not know: a misspelt or misplaced field shows here)."""
    if isinstance(original, dict):
        if not isinstance(loaded, dict):
            return [path or "/"]
        out: list[str] = []
        for key, value in original.items():
            out += (
                _dropped(value, loaded[key], f"{path}/{key}")
                if key in loaded
                else [f"{path}/{key}"]
            )
        return out
    if isinstance(original, list):
        if not isinstance(loaded, list) or len(loaded) != len(original):
            return [path]
        return [
            p
            for i, (a, b) in enumerate(zip(original, loaded, strict=True))
            for p in _dropped(a, b, f"{path}[{i}]")
        ]
    return [] if str(original) == str(loaded) else [f"{path}: {original!r} -> {loaded!r}"]


OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}  # CRDs: no model in the client


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_objects_load_into_the_official_clients_models(overlay: str) -> None:
    kubernetes = pytest.importorskip(
        "kubernetes", reason="the kubernetes client is not installed (issue 13 discovery adds it)"
    )
    api = kubernetes.client.ApiClient()
    for o in render(overlay):
        if o["kind"] in OPERATOR_KINDS:
            assert o["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        assert o["apiVersion"].endswith("v1"), o["apiVersion"]
        model = api.deserialize(json.dumps(o), f"V1{o['kind']}", "application/json")
        back = api.sanitize_for_serialization(model)
        assert _dropped(o, back) == [], f"{o['kind']}/{o['metadata']['name']}"


def test_the_model_check_catches_a_misspelt_field() -> None:
    kubernetes = pytest.importorskip(
        "kubernetes", reason="the kubernetes client is not installed (issue 13 discovery adds it)"
    )
    api = kubernetes.client.ApiClient()
    deployment = one(render("sim-cpu"), "Deployment", "pdorch-decode")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"periodSeconds": 5}
    back = api.sanitize_for_serialization(
        api.deserialize(json.dumps(deployment), "V1Deployment", "application/json")
    )
    assert _dropped(deployment, back) == ["/spec/template/spec/containers[0]/readinesProbe"]


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
