"""The shipped manifests and the shipped Kubernetes runtime agree.

- every overlay's fleet ConfigMap, after the coordinator's own start script wrote the admin
  token into it, loads through `pdorch serve --config`'s loader (`load_fleet_config`) into the
  runtime's discovery settings (`pools/kubernetes/settings.py`), and the autoscaler's raw copy
  (`--config`, no token substituted) loads too;
- the real coordinator, run on the sim-cpu overlay's fleet file (only `api_url`/`token_file`
  pointed at the FAKE API server of tests/kube_apiserver.py, the peer sync dropped), routes
  to simulated engines registered as pods, and every API call its discovery made is granted by
  the rendered Role pdorch-coordinator;
- the real Kubernetes actuator on the vllm-gpu-kv-both overlay's settings scales up, drains and
  scales down, and moves a kv_both pod between pools, and every API call it made is granted by
  the rendered Role pdorch-autoscaler.
"""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from autoscale.actuators.kubernetes import DELETION_COST, CoordinatorDrainer, KubernetesActuator
from autoscale.policy import parse_policy
from pdorch.app.server import run_coordinator
from pdorch.config.fleet import FleetConfig, load_fleet_config, parse_fleet_config
from pools.kubernetes.settings import KubernetesDiscoverySettings
from pools.replica import ReplicaState
from tests.deploy.kustomize import (
    NAMESPACE,
    OVERLAYS,
    POOLS,
    Object,
    configmap_file,
    container,
    find,
    one,
    render,
)
from tests.deploy.test_kubernetes_wiring import grants
from tests.kube_apiserver import FakeKubeApiServer, RecordedRequest
from tests.kubernetes.helpers import wait_state
from tests.kubernetes.sim_engines import SimPodEngine

pytestmark = pytest.mark.integration  # kubectl, processes, HTTP

TOKEN = "0123abcd.token"
KUBE_TOKEN = "fake-kube-token"
FLEET_MOUNT = "/etc/pdorch/fleet"

Grant = tuple[str, str, str, tuple[str, ...]]


# ---- the fleet file through pdorch's loader ------------------------------------------------------


def _volume_mount(workload: Object, c: Object, configmap: str) -> str:
    """Where `c` mounts the (generated) ConfigMap `configmap`."""
    volumes = workload["spec"]["template"]["spec"]["volumes"]
    (volume,) = [
        v["name"]
        for v in volumes
        if "configMap" in v and v["configMap"]["name"].startswith(f"{configmap}-")
    ]
    (mount,) = [m["mountPath"] for m in c["volumeMounts"] if m["name"] == volume]
    return str(mount)


def coordinator_fleet_file(objects: list[Object], tmp: Path) -> Path:
    """Run the coordinator container's start script as the pod does (paths moved under `tmp`,
    `exec pdorch` turned into an echo) and return the fleet file it wrote."""
    coordinators = one(objects, "StatefulSet", "pdorch-coordinator")
    c = container(coordinators, "coordinator")
    assert c["command"] == ["/bin/sh", "-c"]
    (script,) = c["args"]
    mount = _volume_mount(coordinators, c, "pdorch-fleet")
    (tmp / "in").mkdir()
    (tmp / "run").mkdir()
    (tmp / "in" / "fleet.yaml").write_text(configmap_file(objects, "pdorch-fleet", "fleet.yaml"))
    local = (
        script.replace(f"{mount}/", f"{tmp}/in/")
        .replace("/run/pdorch/", f"{tmp}/run/")
        .replace("exec pdorch ", "exec echo pdorch ")
    )
    done = subprocess.run(
        ["/bin/sh", "-c", local],
        env={"PDORCH_ADMIN_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    served = done.stdout.split()
    assert served[:2] == ["pdorch", "serve"]
    written = Path(served[served.index("--config") + 1])
    assert written.parent == tmp / "run"
    return written


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_fleet_configmap_loads_into_the_runtimes_settings(
    overlay: str, tmp_path: Path
) -> None:
    objects = render(overlay)
    config = load_fleet_config(coordinator_fleet_file(objects, tmp_path))
    assert config.coordinator.admin_token == TOKEN
    discovery = config.discovery
    assert isinstance(discovery, KubernetesDiscoverySettings)
    assert discovery.namespace == NAMESPACE
    assert discovery.kv_events_topic == "kv-events"
    assert discovery.kv_events_replay_port == 5558
    for pool in POOLS:
        deployment = one(objects, "Deployment", f"pdorch-{pool}")
        assert discovery.pool(pool).deployment == deployment["metadata"]["name"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        # the runtime's own selector parsing is the API server's; a plain a=b,c=d list here
        terms = dict(t.split("=", 1) for t in discovery.pool(pool).label_selector.split(","))
        assert terms.items() <= labels.items()
        ports = {p["name"]: p["containerPort"] for p in container(deployment, "engine")["ports"]}
        assert discovery.port_of(pool) == ports["http"]
        assert discovery.kv_events_port_of(pool) == ports["kv-events"]
        assert discovery.kv_events_replay_port_of(pool) == ports["kv-replay"]
        assert discovery.side_channel_port_of(pool) == ports["nixl"]
        assert labels.get(discovery.role_label) in (
            None,  # sim-cpu: no role label, never moved
            "kv_producer" if pool == "prefill" else "kv_consumer",
            "kv_both",
        )

    # the autoscaler reads the ConfigMap file as mounted (no token substituted: it needs only
    # `discovery:`), the same discovery settings
    autoscaler = one(objects, "Deployment", "pdorch-autoscaler")
    c = container(autoscaler, "autoscaler")
    command = c["command"]
    path = command[command.index("--config") + 1]
    mount = _volume_mount(autoscaler, c, "pdorch-fleet")
    assert mount == FLEET_MOUNT
    raw = tmp_path / "autoscaler" / Path(path).relative_to(mount)
    raw.parent.mkdir()
    raw.write_text(configmap_file(objects, "pdorch-fleet", "fleet.yaml"))
    assert load_fleet_config(raw).discovery == discovery


# ---- API calls against the granted verbs ---------------------------------------------------------

_PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?$")
_DEPLOYMENTS = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/deployments/([^/]+)(/scale)?$")
_VERBS = {"GET": "get", "PATCH": "patch", "DELETE": "delete", "PUT": "update", "POST": "create"}


def api_call(r: RecordedRequest) -> tuple[str, str, str, str | None]:
    """(apiGroup, resource, verb, name) of one request, as the API server's RBAC sees it."""
    if match := _PODS.match(r.path):
        ns, name = match.groups()
        group, resource = "", "pods"
    elif match := _DEPLOYMENTS.match(r.path):
        ns, name, scale = match.groups()
        group, resource = "apps", "deployments/scale" if scale else "deployments"
    else:
        raise AssertionError(f"a call the test does not know: {r.method} {r.path}")
    assert ns == NAMESPACE, r.path  # the Roles are namespaced
    verb = _VERBS[r.method]
    if verb == "get" and name is None:
        verb = "watch" if r.query.get("watch") in ("true", "1") else "list"
    return group, resource, verb, name


def granted(call: tuple[str, str, str, str | None], rules: set[Grant]) -> bool:
    group, resource, verb, name = call
    return any(
        (g, res, v) == (group, resource, verb) and (not names or name in names)
        for g, res, v, names in rules
    )


def role_grants(objects: list[Object], name: str) -> set[Grant]:
    (role,) = [r for r in find(objects, "Role") if r["metadata"]["name"] == name]
    return grants(role)


def calls(kube: FakeKubeApiServer) -> list[tuple[str, str, str, str | None]]:
    return [api_call(r) for r in list(kube.requests)]


def discovery_under_test(
    config: FleetConfig, kube: FakeKubeApiServer, token_file: Path
) -> FleetConfig:
    """The shipped fleet file with only what a pod gets from its environment replaced: the
    API server's address and token (in-cluster defaults), the coordinator's sync peers (other
    pods' DNS names)."""
    data: dict[str, Any] = config.model_dump(mode="json", exclude_unset=True)
    assert data["discovery"].get("api_url") is None  # in-cluster default in the manifests
    data["discovery"] |= {"api_url": kube.url, "token_file": str(token_file)}
    data.pop("sync")
    return parse_fleet_config(data)


@pytest.fixture
def kube() -> Iterator[FakeKubeApiServer]:
    with FakeKubeApiServer(token=KUBE_TOKEN, namespace=NAMESPACE, bookmark_interval_s=0.2) as fake:
        yield fake


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "kube-token"
    path.write_text(KUBE_TOKEN + "\n")
    return path


async def test_the_coordinator_routes_with_the_shipped_fleet_file_within_its_role(
    kube: FakeKubeApiServer, token_file: Path, tmp_path: Path
) -> None:
    objects = render("sim-cpu")
    shipped = load_fleet_config(coordinator_fleet_file(objects, tmp_path))
    config = discovery_under_test(shipped, kube, token_file)
    engines = {
        pool: SimPodEngine(tmp_path / f"{pool}.log", role=pool, model=config.served_model_name)
        for pool in POOLS
    }
    try:
        for engine in engines.values():
            engine.wait_ready()
        names = {}
        for pool, engine in engines.items():
            labels = one(objects, "Deployment", f"pdorch-{pool}")["spec"]["template"]["metadata"]
            names[pool] = f"pdorch-{pool}-0"
            kube.add_pod(
                names[pool],
                labels["labels"],
                ready=True,
                pod_ip="127.0.0.1",
                annotations=engine.annotations,
            )
        async with run_coordinator(config, port=0) as pd:
            for pool, name in names.items():
                await wait_state(pd, name, ReplicaState.HEALTHY, pool=pool)
            body = {"model": config.served_model_name, "prompt": "hello", "max_tokens": 8}
            async with httpx.AsyncClient(base_url=pd.url, timeout=60.0) as client:
                answer = await client.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["text"]
            # a pod that is deleted leaves routing
            kube.delete_pod(names["prefill"])
            await wait_state(pd, names["prefill"], None)
    finally:
        for engine in engines.values():
            engine.stop()
    made = calls(kube)
    rules = role_grants(objects, "pdorch-coordinator")
    assert {c[:3] for c in made} >= {("", "pods", "list"), ("", "pods", "watch")}
    assert [c for c in made if not granted(c, rules)] == []


class _NeverSawIt(BaseHTTPRequestHandler):
    """A coordinator that never saw the pod answers a drain with 404 (CoordinatorDrainer: fine)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def drain_target() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NeverSawIt)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


async def test_the_actuator_stays_within_the_autoscalers_role(
    kube: FakeKubeApiServer, token_file: Path, tmp_path: Path, drain_target: str
) -> None:
    objects = render("vllm-gpu-kv-both")
    shipped = load_fleet_config(coordinator_fleet_file(objects, tmp_path))
    settings = discovery_under_test(shipped, kube, token_file).discovery
    assert isinstance(settings, KubernetesDiscoverySettings)
    for pool in POOLS:
        labels = one(objects, "Deployment", f"pdorch-{pool}")["spec"]["template"]["metadata"]
        kube.add_deployment(f"pdorch-{pool}", labels["labels"], replicas=1)
    for pod in kube.pods():
        kube.set_ready(pod["metadata"]["name"], True)
    policy = parse_policy(
        {
            "pools": {
                "prefill": {"min": 0, "max": 3, "drain_timeout_s": 2},
                "decode": {"min": 0, "max": 3, "drain_timeout_s": 2},
            }
        }
    )
    drainer = CoordinatorDrainer([drain_target])
    actuator = KubernetesActuator(settings, drainer, policy=policy, settle_s=10, poll_s=0.05)
    try:
        await actuator.refresh()
        actuator.scale("decode", 2, now=0.0)  # up: PATCH scale
        await actuator.idle(30)
        assert kube.deployment_replicas("pdorch-decode") == 2
        (prefill_pod,) = kube.pods("pdorch.io/pool=prefill")
        await actuator.refresh()
        actuator.scale("prefill", 0, now=0.0)  # down: drain, deletion cost, PATCH scale
        await actuator.idle(30)
        assert kube.pod(prefill_pod["metadata"]["name"]) is None
        decode_pods = [p["metadata"]["name"] for p in kube.pods("pdorch.io/pool=decode")]
        for name in decode_pods:
            kube.set_ready(name, True)
        await actuator.refresh()
        (moving, *_) = actuator.switchable("decode")  # kv_both pods only
        actuator.switch_role(moving, "prefill", now=0.0)  # drain, relabel, PATCH scale
        await actuator.idle(30)
        moved = kube.pod(moving)
        assert moved is not None and moved["metadata"]["labels"]["pdorch.io/pool"] == "prefill"
        assert actuator.stats.errors == 0
    finally:
        await actuator.aclose()
        await drainer.aclose()
    # what the pod patches carried: the drained pod's deletion cost, the moved pod's pool label
    patched = [
        r.body["metadata"] for r in kube.requests if r.method == "PATCH" and "/pods/" in r.path
    ]
    assert any(DELETION_COST in m.get("annotations", {}) for m in patched)
    assert any("pdorch.io/pool" in m.get("labels", {}) for m in patched)
    made = calls(kube)
    rules = role_grants(objects, "pdorch-autoscaler")
    assert {c[:3] for c in made} >= {
        ("", "pods", "list"),
        ("", "pods", "patch"),
        ("apps", "deployments/scale", "get"),
        ("apps", "deployments/scale", "patch"),
    }
    assert [c for c in made if not granted(c, rules)] == []
    # and the coordinators' Role could not have done it
    coordinator = role_grants(objects, "pdorch-coordinator")
    assert [c for c in made if not granted(c, coordinator)] != []
