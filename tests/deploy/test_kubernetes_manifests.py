"""deploy/kubernetes: every overlay renders with `kubectl kustomize` into the whole fleet; the
engines' command line is the local launcher's for the same spec (the golden test); the
generated patches are current."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from pools.k8s_render import load_engines, render_overlay
from pools.launch_engines import sim_cli_args
from pools.launch_spec import SimLaunchSpec, VllmLaunchSpec
from pools.roles import EngineRole
from tests.deploy.kustomize import (
    NAMESPACE,
    OVERLAYS,
    OVERLAYS_DIR,
    POOLS,
    REPO,
    VLLM_OVERLAYS,
    Object,
    container,
    env_values,
    one,
    ports,
    render,
)

pytestmark = pytest.mark.integration  # runs kubectl

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
        ("Role", "pdorch-autoscaler"),
        ("Role", "pdorch-coordinator"),
        ("RoleBinding", "pdorch-autoscaler"),
        ("RoleBinding", "pdorch-coordinator"),
        ("Service", "pdorch"),
        ("Service", "pdorch-coordinator-peers"),
        ("Service", "pdorch-engines"),
        ("ServiceAccount", "pdorch-autoscaler"),
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
    `pools.launch_engines.VllmEngine.start` calls it) for the pod's ports, and its `argv`."""
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
    # the runtime's role label (discovery.role_label, default pdorch.io/kv-role) says the same
    for pool, role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        labels = one(gpu, "Deployment", f"pdorch-{pool}")["spec"]["template"]["metadata"]["labels"]
        assert labels["pdorch.io/kv-role"] == role
    both = render("vllm-gpu-kv-both")
    for pool in POOLS:
        deployment = one(both, "Deployment", f"pdorch-{pool}")
        assert _kv_role(container(deployment, "engine")) == "kv_both"
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["pdorch.io/kv-role"] == "kv_both"
        assert "pdorch.io/switchable" not in labels  # a label nothing reads


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
