"""Render pdorch's kustomize overlays with the real `kubectl kustomize` (offline, no cluster), and
read the objects and the alert rules the deploy tests share."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"
OVERLAYS_DIR = KUBERNETES / "overlays"
OVERLAYS = sorted(p.name for p in OVERLAYS_DIR.iterdir() if (p / "kustomization.yaml").is_file())
NAMESPACE = "pdorch"
POOLS = ("prefill", "decode")
RULES = KUBERNETES / "components" / "monitoring" / "prometheusrule.yaml"
VLLM_OVERLAYS = [o for o in OVERLAYS if o.startswith("vllm-")]

Object = dict[str, Any]


def kubectl() -> str:
    """The kubectl binary, or skip the test saying how to get it."""
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip(
            "kubectl is not installed (apt-get install -y --no-install-recommends kubectl; "
            ".ci/run does): the manifests cannot be rendered"
        )
    return path


@functools.cache
def _render(overlay: str) -> str:
    done = subprocess.run(
        [kubectl(), "kustomize", str(OVERLAYS_DIR / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {overlay} failed:\n{done.stderr}"
    return done.stdout


def render(overlay: str) -> list[Object]:
    """The overlay's objects (a fresh copy each call: tests may change them)."""
    return [doc for doc in yaml.safe_load_all(_render(overlay)) if doc]


def find(objects: list[Object], kind: str, name: str | None = None) -> list[Object]:
    """Objects of `kind` (and `name`; a generated ConfigMap's name has a hash suffix)."""
    found = [o for o in objects if o["kind"] == kind]
    if name is not None:
        found = [
            o
            for o in found
            if o["metadata"]["name"] == name or o["metadata"]["name"].startswith(f"{name}-")
        ]
    return found


def one(objects: list[Object], kind: str, name: str) -> Object:
    found = find(objects, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def container(workload: Object, name: str) -> Object:
    containers = workload["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == name)


def ports(c: Object) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in c.get("ports", [])}


def env_values(c: Object) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}


def configmap_file(objects: list[Object], name: str, key: str) -> str:
    """One file of a (generated) ConfigMap."""
    text: str = one(objects, "ConfigMap", name)["data"][key]
    return text


def rule_groups() -> list[dict[str, Any]]:
    """The PrometheusRule's `spec.groups` (a Prometheus rule file's `groups`)."""
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["spec"]["groups"]
    return groups


def rule_exprs() -> list[tuple[str, str]]:
    """(alert name, expr) of every alert rule."""
    return [(rule["alert"], rule["expr"]) for group in rule_groups() for rule in group["rules"]]
