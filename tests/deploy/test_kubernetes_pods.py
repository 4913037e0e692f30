"""deploy/kubernetes, run here: the sim-cpu engine pod's command starts a working engine; the
coordinator's start script writes the admin token; every object loads into the official
client's models."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from pools.k8s_render import load_engines
from tests.data import VLLM_FIXTURES, require_file
from tests.deploy.kustomize import (
    KUBERNETES,
    OVERLAYS,
    OVERLAYS_DIR,
    configmap_file,
    container,
    one,
    render,
)
from tests.ports import free_port

pytestmark = pytest.mark.integration  # runs kubectl, a simulated engine and sh

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
    (etc / "fleet.yaml").write_text(configmap_file(objects, "pdorch-fleet", "fleet.yaml"))
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
